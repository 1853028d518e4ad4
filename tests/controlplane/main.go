// Command controlplane runs a real Kubernetes control plane for kata-sizing's tests:
// embedded etcd, kube-apiserver and the kube-controller-manager's controllers, all built
// from the published Go modules. It is also the node's binary: the kubelet, kube-scheduler
// and kube-proxy subcommands run those components from the same module pins.
//
//	controlplane --dir DIR --etcd-port P --apiserver-port P [--address IP] [--node-name N] \
//	    --sa-user system:serviceaccount:NS:NAME [-- extra kube-apiserver flags]
//	controlplane kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|kubelet FLAGS...
//
// The API server serves and advertises on --address (127.0.0.1 unless a node joins: the
// kubernetes Service's endpoint must be an address a pod can reach, and the API server
// refuses a loopback one). It writes into DIR a CA (ca.crt, ca.key) and what each component
// needs to reach the API server as its own identity: admin.kubeconfig (system:masters),
// operator.token (the --sa-user identity), scheduler.kubeconfig, proxy.kubeconfig and
// node.kubeconfig (system:node:<node-name>, group system:nodes, as a client certificate),
// the kubelet's serving certificate (kubelet.crt: the address and the node name) and the
// API server's client certificate for the kubelet (kubelet-client.crt). It prints
// "controlplane ready" once /readyz answers ok, and stops everything on SIGTERM.
// DIR/audit.log is the API server's audit log (JSON lines, level Metadata) of every request
// made with the operator's identity or any other ServiceAccount's (the operator's chart on the
// node runs as its own): what the real authorizer allowed or refused (403), and every write, for
// the tests to count; and pod creations and resizes by anyone (where an admission policy with
// the Audit action records its finding).
// SIGUSR1 compacts etcd at its current revision, which expires every older watch (410).
// The API server and controller manager run as child processes of this same binary
// (their global flag and metric registries are not meant to share one process).
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "kube-apiserver":
			os.Args = os.Args[1:]
			os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
		case "kube-controller-manager":
			os.Args = os.Args[1:]
			os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
		case "kube-scheduler":
			os.Args = os.Args[1:]
			os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
		case "kube-proxy":
			os.Args = os.Args[1:]
			os.Exit(cli.Run(proxy.NewProxyCommand()))
		case "kubelet":
			os.Args = os.Args[1:]
			os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
		}
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

// Pinned beside each other: the API server allocates the kubernetes Service the first
// address of the range, and its serving certificate must name it.
const (
	serviceCIDR      = "10.96.0.0/24"
	kubernetesSvcIP  = "10.96.0.1"
	defaultNodeName  = "kata-sizing-node"
	defaultListenIP  = "127.0.0.1"
	serviceAccountIs = "https://kubernetes.default.svc.cluster.local"
)

// The controllers a Deployment with a PodDisruptionBudget and in-cluster clients need on a
// real node; the first three are all the API-server-only tests use. No daemonset
// controller: a kata-deploy DaemonSet applied by a test must stay a stored object. The
// ValidatingAdmissionPolicy status controller type-checks each policy's CEL against the
// types it matches and writes status.typeChecking (tests/api/test_real_admission.py reads it).
const defaultControllers = "garbage-collector-controller,namespace-controller,serviceaccount-controller," +
	"deployment-controller,replicaset-controller,endpoints-controller,endpointslice-controller," +
	"endpointslice-mirroring-controller,root-ca-certificate-publisher-controller,disruption-controller," +
	"pod-garbage-collector-controller,node-lifecycle-controller,validatingadmissionpolicy-status-controller"

func run() error {
	flags := flag.NewFlagSet("controlplane", flag.ContinueOnError)
	dir := flags.String("dir", "", "state directory (certificates, tokens, etcd data)")
	etcdPort := flags.Int("etcd-port", 0, "etcd client port on 127.0.0.1")
	apiPort := flags.Int("apiserver-port", 0, "kube-apiserver secure port on --address")
	address := flags.String("address", defaultListenIP,
		"address the API server binds and advertises (not loopback when a node joins)")
	nodeName := flags.String("node-name", defaultNodeName, "name of the node the credentials are for")
	saUser := flags.String("sa-user", "system:serviceaccount:kata-sizing:kata-sizing",
		"user name of the operator's identity, as a ServiceAccount token would carry it")
	controllers := flags.String("controllers", defaultControllers, "kube-controller-manager controllers to run")
	if err := flags.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *dir == "" || *etcdPort == 0 || *apiPort == 0 {
		return fmt.Errorf("--dir, --etcd-port and --apiserver-port are required")
	}
	ip := net.ParseIP(*address)
	if ip == nil {
		return fmt.Errorf("--address %q is not an IP address", *address)
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s", net.JoinHostPort(*address, fmt.Sprint(*apiPort)))
	if err := writeCredentials(*dir, server, ip, *nodeName, *saUser); err != nil {
		return err
	}

	etcd, err := startEtcd(*dir, *etcdPort)
	if err != nil {
		return err
	}
	defer etcd.Close()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	// The kubernetes Service's endpoint is the advertised address; a loopback one is refused,
	// and without a node nothing would use it.
	reconciler := "lease"
	if ip.IsLoopback() {
		reconciler = "none"
	}
	file := func(name string) string { return filepath.Join(*dir, name) }
	apiArgs := append([]string{"kube-apiserver",
		"--etcd-servers=http://127.0.0.1:" + fmt.Sprint(*etcdPort),
		"--bind-address=" + *address,
		"--advertise-address=" + *address,
		"--secure-port=" + fmt.Sprint(*apiPort),
		"--tls-cert-file=" + file("serving.crt"),
		"--tls-private-key-file=" + file("serving.key"),
		"--client-ca-file=" + file("ca.crt"),
		"--token-auth-file=" + file("tokens.csv"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--kubelet-client-certificate=" + file("kubelet-client.crt"),
		"--kubelet-client-key=" + file("kubelet-client.key"),
		"--kubelet-certificate-authority=" + file("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=" + serviceAccountIs,
		"--service-account-key-file=" + file("sa.key"),
		"--service-account-signing-key-file=" + file("sa.key"),
		"--service-cluster-ip-range=" + serviceCIDR,
		"--allow-privileged=true",
		"--profiling=false",
		"--endpoint-reconciler-type=" + reconciler,
		"--audit-policy-file=" + file("audit-policy.yaml"),
		"--audit-log-path=" + file("audit.log"),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--v=1",
	}, flags.Args()...)
	api := exec.Command(self, apiArgs...)
	api.Stdout, api.Stderr = os.Stdout, os.Stderr
	api.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := api.Start(); err != nil {
		return err
	}
	children := []*exec.Cmd{api}
	stopAll := func() {
		for i := len(children) - 1; i >= 0; i-- {
			_ = children[i].Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func(c *exec.Cmd) { _ = c.Wait(); close(done) }(children[i])
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = children[i].Process.Kill()
			}
		}
	}
	defer stopAll()

	if err := waitReady(*dir, server, 3*time.Minute); err != nil {
		return err
	}
	kcm := exec.Command(self, "kube-controller-manager",
		"--kubeconfig="+file("admin.kubeconfig"),
		"--controllers="+*controllers,
		"--root-ca-file="+file("ca.crt"),
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--concurrent-gc-syncs=5",
		"--v=1",
	)
	kcm.Stdout, kcm.Stderr = os.Stdout, os.Stderr
	kcm.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := kcm.Start(); err != nil {
		return err
	}
	children = append(children, kcm)
	fmt.Println("controlplane ready")

	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	exited := make(chan error, 2)
	for _, c := range children {
		go func(c *exec.Cmd) { exited <- fmt.Errorf("%s exited: %v", c.Args[1], c.Wait()) }(c)
	}
	for {
		select {
		case s := <-signals:
			if s == syscall.SIGUSR1 {
				compact(etcd)
				continue
			}
			fmt.Println("controlplane stopping")
			return nil
		case err := <-exited:
			return err
		}
	}
}

func startEtcd(dir string, port int) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.LogLevel = "error"
	client, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port))
	peer, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd did not become ready in 60s")
	}
}

// compact expires every watch that starts before the current revision.
func compact(e *embed.Etcd) {
	rev := e.Server.KV().Rev()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Through raft, as an etcd client's Compact would; Physical waits until it is applied.
	if _, err := e.Server.Compact(ctx, &etcdserverpb.CompactionRequest{Revision: rev, Physical: true}); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane: compact:", err)
		return
	}
	fmt.Printf("controlplane compacted etcd at revision %d\n", rev)
}

func waitReady(dir, server string, limit time.Duration) error {
	admin, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		return err
	}
	pool, err := certutil.NewPool(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+string(admin))
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready after %s", limit)
}
