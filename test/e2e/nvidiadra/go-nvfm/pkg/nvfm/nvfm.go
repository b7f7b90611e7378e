// Package nvfm is the part of NVIDIA's fabric manager bindings
// (github.com/NVIDIA/go-nvfm, which the Go module proxy does not serve)
// that NVIDIA's DRA driver v0.5.0 compiles against, written for the
// suite's build of that driver. It reaches no fabric manager: Init and
// Connect answer ERROR_LIBRARY_NOT_FOUND, so the driver's fabric-manager
// partitioning (an alpha feature gate, off by default) fails cleanly
// instead of doing anything.
package nvfm

import "fmt"

// Return is a fabric manager call's result (fmReturn_t).
type Return int32

// The results this package gives; the values are fmReturn_t's.
//
//nolint:revive // NVIDIA's names, which the driver uses.
const (
	SUCCESS                 Return = 0
	ERROR_LIBRARY_NOT_FOUND Return = -7
)

// Error says what r is.
func (r Return) Error() string {
	switch r {
	case SUCCESS:
		return "success"
	case ERROR_LIBRARY_NOT_FOUND:
		return "fabric manager library not found (the suite's go-nvfm stand-in has none)"
	}
	return fmt.Sprintf("fabric manager error %d", int32(r))
}

// String is Error, for %s.
func (r Return) String() string { return r.Error() }

// FabricPartitionId names a fabric partition.
type FabricPartitionId uint32 //nolint:revive // NVIDIA's spelling, which the driver uses.

// FabricPartitionGpuInfo is one GPU of a partition.
type FabricPartitionGpuInfo struct {
	PhysicalId          uint32 //nolint:revive // NVIDIA's spelling.
	Uuid                [80]int8
	PciBusId            [32]int8 //nolint:revive // NVIDIA's spelling.
	NumNvLinksAvailable uint32
	MaxNumNvLinks       uint32
	NvlinkLineRateMBps  uint32
}

// FabricPartitionInfo is one partition.
type FabricPartitionInfo struct {
	PartitionId FabricPartitionId //nolint:revive // NVIDIA's spelling.
	IsActive    uint32
	NumGpus     uint32
	GpuInfo     [8]FabricPartitionGpuInfo
}

// FabricPartitionList is the fabric manager's partitions.
type FabricPartitionList struct {
	Version          uint32
	NumPartitions    uint32
	MaxNumPartitions uint32
	PartitionInfo    [64]FabricPartitionInfo
}

// ConnectParams says where the fabric manager listens.
type ConnectParams struct {
	AddressInfo         string
	TimeoutMs           uint32
	AddressIsUnixSocket bool
}

// ConnectOption sets one of ConnectParams.
type ConnectOption func(*ConnectParams)

// WithAddress connects over TCP to host:port.
func WithAddress(addr string) ConnectOption {
	return func(p *ConnectParams) { p.AddressInfo, p.AddressIsUnixSocket = addr, false }
}

// WithUnixSocket connects over a Unix socket.
func WithUnixSocket(path string) ConnectOption {
	return func(p *ConnectParams) { p.AddressInfo, p.AddressIsUnixSocket = path, true }
}

// WithTimeoutMs bounds the connection's set-up.
func WithTimeoutMs(ms uint32) ConnectOption {
	return func(p *ConnectParams) { p.TimeoutMs = ms }
}

// Handle is one connection to the fabric manager.
type Handle interface {
	Disconnect() Return
	GetSupportedFabricPartitions() (FabricPartitionList, Return)
	ActivateFabricPartition(FabricPartitionId) Return
	DeactivateFabricPartition(FabricPartitionId) Return
}

// Interface is the fabric manager library.
type Interface interface {
	Init() Return
	Shutdown() Return
	Connect(...ConnectOption) (Handle, Return)
	ConnectWithParams(ConnectParams) (Handle, Return)
	ErrorString(Return) string
}

// LibraryOption configures New.
type LibraryOption func(*library)

// WithLibraryPath names the libnvfm.so to load (unused: none is loaded).
func WithLibraryPath(path string) LibraryOption {
	return func(l *library) { l.path = path }
}

// New returns the library, which has no fabric manager behind it.
func New(opts ...LibraryOption) Interface {
	l := &library{}
	for _, o := range opts {
		o(l)
	}
	return l
}

type library struct{ path string }

func (*library) Init() Return     { return ERROR_LIBRARY_NOT_FOUND }
func (*library) Shutdown() Return { return SUCCESS }

func (l *library) Connect(opts ...ConnectOption) (Handle, Return) {
	var p ConnectParams
	for _, o := range opts {
		o(&p)
	}
	return l.ConnectWithParams(p)
}

func (*library) ConnectWithParams(ConnectParams) (Handle, Return) {
	return nil, ERROR_LIBRARY_NOT_FOUND
}

func (*library) ErrorString(r Return) string { return r.Error() }
