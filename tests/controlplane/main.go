// Command controlplane runs a real Kubernetes control plane for kata-sizing's tests on
// 127.0.0.1: embedded etcd, kube-apiserver and the kube-controller-manager's
// garbage-collector, namespace and serviceaccount controllers, all built from the
// published Go modules. No kubelet and no scheduler: pods are stored, never run.
//
//	controlplane --dir DIR --etcd-port P --apiserver-port P \
//	    --sa-user system:serviceaccount:NS:NAME [-- extra kube-apiserver flags]
//
// It writes DIR/ca.crt, DIR/admin.token, DIR/operator.token and DIR/admin.kubeconfig,
// prints "controlplane ready" once /readyz answers ok, and stops everything on SIGTERM.
// DIR/audit.log is the API server's audit log (JSON lines, level Metadata) of every request
// made with the operator's identity: what the real authorizer allowed or refused (403), and
// every write, for the tests to count; and pod creations and resizes by anyone (where an
// admission policy with the Audit action records its finding).
// SIGUSR1 compacts etcd at its current revision, which expires every older watch (410).
// The API server and controller manager run as child processes of this same binary
// (their global flag and metric registries are not meant to share one process).
package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
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
		}
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "", "state directory (certificates, tokens, etcd data)")
	etcdPort := flag.Int("etcd-port", 0, "etcd client port on 127.0.0.1")
	apiPort := flag.Int("apiserver-port", 0, "kube-apiserver secure port on 127.0.0.1")
	saUser := flag.String("sa-user", "system:serviceaccount:kata-sizing:kata-sizing",
		"user name of the operator's identity, as a ServiceAccount token would carry it")
	controllers := flag.String("controllers",
		"garbage-collector-controller,namespace-controller,serviceaccount-controller",
		"kube-controller-manager controllers to run")
	flag.Parse()
	if *dir == "" || *etcdPort == 0 || *apiPort == 0 {
		return fmt.Errorf("--dir, --etcd-port and --apiserver-port are required")
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	if err := writeCredentials(*dir, *saUser, *apiPort); err != nil {
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
	apiArgs := append([]string{"kube-apiserver",
		"--etcd-servers=http://127.0.0.1:" + fmt.Sprint(*etcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + fmt.Sprint(*apiPort),
		"--tls-cert-file=" + filepath.Join(*dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(*dir, "serving.key"),
		"--token-auth-file=" + filepath.Join(*dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(*dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(*dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/24",
		"--allow-privileged=true",
		"--profiling=false",
		// No kubelet or Service traffic here: the kubernetes Service endpoint would be loopback.
		"--endpoint-reconciler-type=none",
		"--audit-policy-file=" + filepath.Join(*dir, "audit-policy.yaml"),
		"--audit-log-path=" + filepath.Join(*dir, "audit.log"),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--v=1",
	}, flag.Args()...)
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

	if err := waitReady(*dir, *apiPort, 3*time.Minute); err != nil {
		return err
	}
	kcm := exec.Command(self, "kube-controller-manager",
		"--kubeconfig="+filepath.Join(*dir, "admin.kubeconfig"),
		"--controllers="+*controllers,
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

func writeCredentials(dir, saUser string, apiPort int) error {
	cert, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1",
		[]net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost", "kubernetes.default.svc"})
	if err != nil {
		return err
	}
	// The bundle is the serving certificate followed by the CA that signed it.
	if err := os.WriteFile(filepath.Join(dir, "serving.crt"), cert, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "serving.key"), key, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), cert, 0o644); err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	if err := os.WriteFile(filepath.Join(dir, "sa.key"), saPEM, 0o600); err != nil {
		return err
	}
	admin, operator := token(), token()
	ns := "default"
	if parts := strings.Split(saUser, ":"); len(parts) == 4 {
		ns = parts[2]
	}
	tokens := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,%s,operator-uid,\"system:serviceaccounts,system:serviceaccounts:%s,system:authenticated\"\n",
		admin, operator, saUser, ns)
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		return err
	}
	auditPolicy := fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [%q]
# Pod creations and resizes, whoever makes them: the admission policies' Audit action shows here.
- level: Metadata
  verbs: [create, patch, update]
  resources: [{group: "", resources: [pods, pods/resize]}]
- level: None
`, saUser)
	files := map[string]string{"admin.token": admin, "operator.token": operator, "audit-policy.yaml": auditPolicy}
	for name, value := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(value), 0o600); err != nil {
			return err
		}
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: controlplane
  cluster: {server: "https://127.0.0.1:%d", certificate-authority: %q}
users:
- name: admin
  user: {token: %q}
contexts:
- name: admin
  context: {cluster: controlplane, user: admin}
current-context: admin
`, apiPort, filepath.Join(dir, "ca.crt"), admin)
	return os.WriteFile(filepath.Join(dir, "admin.kubeconfig"), []byte(kubeconfig), 0o600)
}

func token() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func waitReady(dir string, port int, limit time.Duration) error {
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
	readyz := fmt.Sprintf("https://127.0.0.1:%d/readyz", port)
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, readyz, nil)
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
