// Command fakecri serves the fake remote container runtime of
// k8s.io/cri-client/pkg/fake on the unix socket given as its first argument
// until it is signalled, so a kubelet can run pods without images, cgroups
// for containers or a network. scripts/upstream.sh builds it inside the
// kubelet's own module (same k8s.io/* versions); it is a program of this
// repository, not upstream code.
//
// Given an http:// URL as its second argument, it posts every container exec
// (CRI ExecSync: what the kubelet runs for exec probes and for postStart and
// preStop exec hooks, pkg/kubelet/lifecycle/handlers.go `Run` calling
// kuberuntime's `RunInContainer`) to that URL as JSON and answers with the
// exit code, stdout and stderr the URL returns; without one, an exec does
// nothing and succeeds (the fake's own ExecSync).
//
// Kubernetes code cited here is at v1.37.2 (k8s.io/* staging modules at
// v0.37.2).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	fake "k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// hooked is the fake runtime with ExecSync posted to an exec hook URL.
type hooked struct {
	*fake.RemoteRuntime
	url string
}

// execCall is what the exec hook receives: the container, with the pod
// labels the kubelet puts on every container it creates
// (pkg/kubelet/kuberuntime/labels.go, newContainerLabels), and the command.
type execCall struct {
	ContainerID  string   `json:"containerId"`
	Container    string   `json:"container"`
	PodName      string   `json:"podName"`
	PodNamespace string   `json:"podNamespace"`
	PodUID       string   `json:"podUid"`
	Cmd          []string `json:"cmd"`
}

// execAnswer is what the exec hook answers.
type execAnswer struct {
	ExitCode int32  `json:"exitCode"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

func (h *hooked) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	if h.url == "" {
		return h.RemoteRuntime.ExecSync(ctx, req)
	}
	st, err := h.RuntimeService.ContainerStatus(ctx, req.ContainerId, false)
	if err != nil {
		return nil, err
	}
	labels := st.GetStatus().GetLabels()
	body, err := json.Marshal(execCall{
		ContainerID:  req.ContainerId,
		Container:    labels["io.kubernetes.container.name"],
		PodName:      labels["io.kubernetes.pod.name"],
		PodNamespace: labels["io.kubernetes.pod.namespace"],
		PodUID:       labels["io.kubernetes.pod.uid"],
		Cmd:          req.Cmd,
	})
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(req.Timeout) * time.Second
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return nil, fmt.Errorf("exec hook %s: %w", h.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("exec hook %s answered %s", h.url, resp.Status)
	}
	var a execAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return nil, fmt.Errorf("exec hook %s: %w", h.url, err)
	}
	return &runtimeapi.ExecSyncResponse{ExitCode: a.ExitCode, Stdout: []byte(a.Stdout), Stderr: []byte(a.Stderr)}, nil
}

func main() {
	if len(os.Args) != 2 && len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: fakecri unix:///path/to/cri.sock [exec-hook-url]")
		os.Exit(2)
	}
	rt := fake.NewFakeRemoteRuntime()
	// Images "pulled" by the fake have this size; the kubelet refuses an
	// image status without one ("Id or size of image ... is not set").
	rt.ImageService.SetFakeImageSize(1 << 20)
	// What the fake's own Start sets: runtime and network ready.
	rt.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	h := &hooked{RemoteRuntime: rt}
	if len(os.Args) == 3 {
		h.url = os.Args[2]
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, h)
	runtimeapi.RegisterImageServiceServer(srv, rt)
	l, err := util.CreateListener(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakecri: listen:", err)
		os.Exit(1)
	}
	go func() {
		if err := srv.Serve(l); err != nil {
			fmt.Fprintln(os.Stderr, "fakecri: serve:", err)
			os.Exit(1)
		}
	}()
	fmt.Println("fakecri: serving", os.Args[1], "exec hook:", h.url)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	srv.Stop()
}
