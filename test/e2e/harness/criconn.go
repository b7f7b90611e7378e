package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// dialCRI opens the gRPC connection a harness keeps to a runtime's CRI
// socket for the runtime's whole life: gRPC reconnects by itself after a
// restart (with a short backoff), so the CRI client made on it stays valid.
func dialCRI(address string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
}

// waitCRI waits until the runtime named name answers on its CRI socket
// address: connect once the socket exists, then ready until it succeeds. It
// fails when exited closes (with exitErr's error), when connect fails, or
// when ctx ends (with ready's last error).
func waitCRI(ctx context.Context, name, address string, exited <-chan struct{}, exitErr func() error,
	connect func() error, ready func(context.Context) error) error {
	var last error
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s exited: %v", name, exitErr())
		default:
		}
		if _, err := os.Stat(address); err == nil {
			if err := connect(); err != nil {
				return err
			}
			err := ready(ctx)
			if err == nil {
				return nil
			}
			last = err
		} else {
			last = fmt.Errorf("no socket %s yet", address)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// criReady asks CRI for its version and for RuntimeReady.
func criReady(ctx context.Context, cri *CRI) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := cri.Runtime.Version(cctx, &runtimeapi.VersionRequest{}); err != nil {
		return fmt.Errorf("CRI Version: %w", err)
	}
	st, err := cri.Runtime.Status(cctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return fmt.Errorf("CRI Status: %w", err)
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == runtimeapi.RuntimeReady {
			if cond.Status {
				return nil
			}
			return fmt.Errorf("RuntimeReady=false: %s %s", cond.Reason, cond.Message)
		}
	}
	return errors.New("no RuntimeReady condition")
}
