package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nri-gpu/nri-gpu/internal/ops/status"
	"github.com/nri-gpu/nri-gpu/inventory"
)

// errNotReady makes `nri-gpu status --ready` exit 1 once it has said why.
var errNotReady = errors.New("not ready")

// statusCmd asks the running plugin for its status over its unix socket.
func statusCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("status-socket", status.DefaultSocket, "the plugin's status socket")
	ready := fs.Bool("ready", false, "only check readiness: exit 0 when the plugin is connected and synchronized, 1 otherwise")
	format := fs.String("o", "table", "output format: table or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkFormat(*format); err != nil {
		return err
	}
	client := statusClient(*socket)
	path := "/status"
	if *ready {
		path = "/ready"
	}
	resp, err := client.Get("http://nri-gpu" + path)
	if err != nil {
		return fmt.Errorf("cannot reach the plugin on %s (is nri-gpu run serving it? see --status-socket): %w", *socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the status from %s: %w", *socket, err)
	}
	if *ready {
		fmt.Fprint(stdout, string(body))
		if resp.StatusCode != http.StatusOK {
			return errNotReady
		}
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status from %s: %s: %s", *socket, resp.Status, strings.TrimSpace(string(body)))
	}
	if *format == "json" {
		_, err := stdout.Write(body)
		return err
	}
	var s status.Status
	if err := json.Unmarshal(body, &s); err != nil {
		return fmt.Errorf("bad status from %s: %w", *socket, err)
	}
	return writeStatus(stdout, s)
}

// statusClient is an HTTP client of the plugin's status socket.
func statusClient(socket string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}},
	}
}

// getStatus asks the running plugin on socket for its status.
func getStatus(socket string) (status.Status, error) {
	resp, err := statusClient(socket).Get("http://nri-gpu/status")
	if err != nil {
		return status.Status{}, fmt.Errorf("cannot reach the plugin on %s (is nri-gpu run serving it? see --status-socket): %w", socket, err)
	}
	defer resp.Body.Close()
	var s status.Status
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status from %s: %s", socket, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&s); err != nil {
		return s, fmt.Errorf("bad status from %s: %w", socket, err)
	}
	return s, nil
}

// writeStatus prints the allocation table.
func writeStatus(w io.Writer, s status.Status) error {
	if s.Ready {
		fmt.Fprintf(w, "Ready: yes\n")
	} else {
		fmt.Fprintf(w, "Ready: no (%s)\n", s.Reason)
	}
	fmt.Fprintf(w, "Sharing policy: %s\n\n", s.Sharing)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUUID\tMODE\tKUBELET\tHOLDERS")
	for _, g := range s.GPUs {
		// KUBELET: the kubelet's assignment, through nri-gpu's device
		// plugin, or device nodes the runtime gave (another device
		// plugin's DeviceSpecs, CDI devices, --device: marked so);
		// HOLDERS: the holders of requests nri-gpu read (annotations,
		// env).
		var kubelet, holders []string
		for _, h := range g.Holders {
			switch {
			case h.Kubelet:
				kubelet = append(kubelet, h.String()+" ("+h.Mode+")")
			case h.Runtime:
				kubelet = append(kubelet, h.String()+" ("+h.Mode+", device nodes)")
			default:
				holders = append(holders, h.String()+" ("+h.Mode+")")
			}
		}
		name := g.Name
		if name == "" {
			name = inventory.UnitLabel(g.Index)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, g.UUID, g.Mode, orDash(kubelet), orDash(holders))
	}
	return tw.Flush()
}

// orDash joins names, or says "-" for none.
func orDash(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	return strings.Join(names, ", ")
}
