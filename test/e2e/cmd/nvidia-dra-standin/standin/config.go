// Package standin is the configuration file of the stand-in of NVIDIA's
// DRA kubelet plugin (test/e2e/cmd/nvidia-dra-standin): what the cluster
// bench writes and the stand-in reads.
package standin

import "fmt"

// Config is the stand-in's configuration file (JSON).
type Config struct {
	// DriverName is the DRA driver's name (NVIDIA's: gpu.nvidia.com).
	DriverName string `json:"driverName"`
	NodeName   string `json:"nodeName"`
	Kubeconfig string `json:"kubeconfig"`
	// PluginDir and RegistrarDir are the kubelet's plugin directory of
	// the driver and its plugin registration directory.
	PluginDir    string `json:"pluginDir"`
	RegistrarDir string `json:"registrarDir"`
	// CDIDir is where the claims' specs are written (the runtime reads
	// it); ToolkitSpec is the node's toolkit spec (JSON) the edits are
	// taken from.
	CDIDir      string `json:"cdiDir"`
	ToolkitSpec string `json:"toolkitSpec"`
	GPUs        []GPU  `json:"gpus"`
}

// GPU is one GPU of the node.
type GPU struct {
	Index       int    `json:"index"`
	Minor       int    `json:"minor"`
	UUID        string `json:"uuid"`
	ProductName string `json:"productName"`
	PCIBusID    string `json:"pciBusID"`
	MemoryMiB   int64  `json:"memoryMiB"`
}

// DeviceName is the GPU's device name in the slice and in the claim's
// CDI device (NVIDIA's deviceinfo.go: GpuInfo.CanonicalName).
func (g GPU) DeviceName() string { return fmt.Sprintf("gpu-%d", g.Minor) }
