package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"strings"

	"github.com/nri-gpu/nri-gpu/internal/kubelet/dra"
	"github.com/nri-gpu/nri-gpu/internal/ops/doctor"
)

// errDoctorFailed is returned when a check failed; the report says which.
var errDoctorFailed = errors.New("some checks failed (see above)")

func doctorCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "nri-gpu's configuration file (YAML): hostRoot, driverRoot; default: built-in defaults")
	var o doctor.Options
	fs.StringVar(&o.ContainerdConfig, "containerd-config", "", "containerd's configuration (default <hostRoot>/etc/containerd/config.toml; imports are followed)")
	fs.StringVar(&o.CRIOConfig, "crio-config", "", "CRI-O's configuration (default <hostRoot>/etc/crio/crio.conf; drop-ins from FILE.d)")
	fs.StringVar(&o.Socket, "socket", "", "the NRI socket (default: from the runtime's configuration, else <hostRoot>/var/run/nri/nri.sock)")
	cdi := fs.String("cdi-dirs", "", "comma-separated CDI spec directories (default: the runtime's cdi_spec_dirs, else /etc/cdi,/var/run/cdi under hostRoot)")
	fs.StringVar(&o.HealthURL, "health-url", "", "nri-gpu's metrics listener, e.g. http://127.0.0.1:9400 (default: from a running nri-gpu's --metrics-addr)")
	fs.StringVar(&o.StatusSocket, "status-socket", "", "nri-gpu's status socket (default <hostRoot>/run/nri-gpu/status.sock)")
	fs.StringVar(&o.Name, "name", "nri-gpu", "the plugin's registered name")
	fs.StringVar(&o.Index, "idx", "10", "the plugin's index")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*cfgPath)
	if err != nil {
		return err
	}
	o.Config = cfg
	if *cdi != "" {
		o.CDIDirs = strings.Split(*cdi, ",")
	}
	o.Self = os.Getpid()
	o.DRACheckpoint = dra.CountPrepared
	o.DRAMadeMIG = dra.CountMade
	results := doctor.Run(o)
	doctor.Print(stdout, results)
	if !doctor.OK(results) {
		return errDoctorFailed
	}
	return nil
}
