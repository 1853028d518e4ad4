// Command podtool is the test image's helper, built static from the standard library only:
//
//	podtool pause                 the pod sandbox's process: sleeps until SIGTERM or SIGINT, reaps orphans
//	podtool hold MIB              allocates and touches MIB MiB, prints "holding MIB MiB", sleeps until killed
//	podtool hold --file PATH      as hold, re-reading the MiB to hold from PATH every 100 ms (grow or shrink)
//	podtool kube-get PATH         GETs PATH from the API server with the pod's in-cluster configuration
//	                              (as client-go's rest.InClusterConfig: KUBERNETES_SERVICE_HOST/PORT, the
//	                              ServiceAccount token and CA), verifying the server's certificate; prints
//	                              the status line and body
//
// It runs inside pods (the pause image and the tools image carry it) and on the host (a
// process moved into a pod's cgroup stands in for the host side of a Kata sandbox).
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "pause":
		pause()
	case "hold":
		err = hold(os.Args[2:])
	case "kube-get":
		if len(os.Args) != 3 {
			usage()
		}
		err = kubeGet(os.Args[2])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podtool:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: podtool pause | hold MIB | hold --file PATH | kube-get PATH")
	os.Exit(2)
}

func pause() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// As PID 1 of the sandbox, reap whatever was re-parented to it.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

const mib = 1 << 20

func hold(args []string) error {
	var target func() (int, error)
	switch {
	case len(args) == 1:
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 0 {
			return fmt.Errorf("hold: %q is not a number of MiB", args[0])
		}
		target = func() (int, error) { return n, nil }
	case len(args) == 2 && args[0] == "--file":
		path := args[1]
		target = func() (int, error) {
			raw, err := os.ReadFile(path)
			if err != nil {
				return 0, err
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil || n < 0 {
				return 0, fmt.Errorf("hold: %s holds %q, not a number of MiB", path, raw)
			}
			return n, nil
		}
	default:
		usage()
	}
	var chunks [][]byte // one MiB each, every page written so the kernel charges it
	held := -1
	for {
		want, err := target()
		if err != nil {
			return err
		}
		for len(chunks) < want {
			chunk := make([]byte, mib)
			for i := 0; i < mib; i += 4096 {
				chunk[i] = 1
			}
			chunks = append(chunks, chunk)
		}
		if len(chunks) > want {
			chunks = chunks[:want:want]
			// Give the dropped chunks back to the kernel now, not at the next GC cycle.
			chunks = append([][]byte(nil), chunks...)
			debug.FreeOSMemory()
		}
		if want != held {
			held = want
			fmt.Printf("holding %d MiB\n", held)
		}
		if len(args) == 1 {
			for { // a fixed amount: hold it until killed
				time.Sleep(time.Hour)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func kubeGet(path string) error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (not in a pod?)")
	}
	token, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%s/ca.crt holds no certificate", serviceAccountDir)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	url := "https://" + net.JoinHostPort(host, port) + path
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	fmt.Printf("GET %s: %s\n%s\n", url, resp.Status, body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered %s", url, resp.Status)
	}
	return nil
}
