package main

// What makes the probe's guest the one Kata boots: the kernel modules a guest kernel without built-in
// virtio drivers needs, the virtio-fs share, and Kata's agent from the guest image or initrd.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

const (
	// Where the probe puts the modules in the initramfs, named NN-<module>.ko in the order they load
	// (each after those it depends on).
	modulesDir = "/kata-sizing/modules"
	// Where Kata's agent mounts the shared directory, and the names of what the probe puts in it.
	shareMountpoint = "/run/kata-containers/shared/containers"
	shareWorkload   = "kata-sizing-workload"
	shareData       = "kata-sizing-data"
	// Where an image's root is mounted for its agent to run in.
	imageRoot = "/rootfs"
	// How long a device (the image's disk, the share) may take to appear after its driver loads, and
	// how long the agent's memory may take to settle (a Go or Rust binary starting under TCG is slow).
	deviceWait = 30 * time.Second
	agentWait  = 60 * time.Second
	// The agent's memory is settled once its resident size stayed the same this long.
	agentSettled = 500 * time.Millisecond
	pollEvery    = 100 * time.Millisecond
	maxSaidBytes = 200
)

// loadModules loads every module the probe put in the initramfs, in order; whether any were there.
// A module already loaded is left; one that fails is said and the boot goes on (a device it drives
// then fails by name where it is needed).
func loadModules() bool {
	names, _ := filepath.Glob(filepath.Join(modulesDir, "*.ko"))
	sort.Strings(names)
	for _, name := range names {
		image, err := os.ReadFile(name)
		if err == nil {
			empty := []byte{0}
			// init_module: the standard library names it on every architecture (finit_module not on all).
			_, _, errno := syscall.Syscall(syscall.SYS_INIT_MODULE, uintptr(unsafe.Pointer(&image[0])),
				uintptr(len(image)), uintptr(unsafe.Pointer(&empty[0])))
			if errno != 0 && errno != syscall.EEXIST {
				err = errno
			}
		}
		if err != nil {
			say("note module %s did not load: %v", filepath.Base(name), err)
		}
		os.Remove(name) // its pages in the initramfs are the guest's memory: Kata's kernel has none
	}
	return len(names) > 0
}

// retry calls try until it succeeds or `wait` has passed; the last error.
func retry(wait time.Duration, try func() error) error {
	deadline := time.Now().Add(wait)
	for {
		err := try()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollEvery)
	}
}

// mountShare mounts the virtio-fs share `tag` where Kata's agent mounts it.
func mountShare(tag string) (string, error) {
	if err := os.MkdirAll(shareMountpoint, 0o755); err != nil {
		return "", err
	}
	err := retry(deviceWait, func() error { return syscall.Mount(tag, shareMountpoint, "virtiofs", 0, "") })
	if errors.Is(err, syscall.ENODEV) {
		err = fmt.Errorf("%v (the guest kernel has no virtiofs: give the probe its modules)", err)
	}
	return shareMountpoint, err
}

// startAgent starts Kata's agent at `path`: from the initramfs (an initrd Kata boots, to which the
// probe appended its own init), or from the image's root (root=, rootfstype=, rootflags= as Kata
// gives them), mounted read-only and the agent run in it. It returns once the agent's resident memory
// settled, so the boot's meminfo holds it.
func startAgent(path string, p map[string]string) error {
	root := "/"
	if device := p["root"]; device != "" {
		if err := mountImage(device, p["rootfstype"], p["rootflags"]); err != nil {
			return err
		}
		root = imageRoot
	}
	if _, err := os.Stat(filepath.Join(root, path)); err != nil {
		return fmt.Errorf("the agent %s is not in the guest's root %s: %v", path, root, err)
	}
	command := exec.Command(path)
	command.Dir = "/"
	command.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if root != "/" {
		command.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	}
	output, err := command.StdoutPipe()
	if err != nil {
		return err
	}
	command.Stderr = command.Stdout
	if err := command.Start(); err != nil {
		return fmt.Errorf("the agent %s did not start: %v", path, err)
	}
	said := make(chan string, 1)
	go func() { // drained for as long as the agent writes: a full pipe would stop it
		scanner := bufio.NewScanner(output)
		scanner.Buffer(make([]byte, 64*1024), 1024*1024)
		first := ""
		for scanner.Scan() {
			if line := strings.TrimSpace(scanner.Text()); first == "" && line != "" {
				first = line
				if len(first) > maxSaidBytes {
					first = first[:maxSaidBytes]
				}
				said <- first
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- command.Wait() }()
	resident, stable, settled := int64(-1), time.Duration(0), false
	for waited := time.Duration(0); waited < agentWait && !settled; waited += pollEvery {
		select {
		case err := <-exited:
			why := "Kata's agent ends without its vsock device"
			if exit, ok := err.(*exec.ExitError); ok {
				if status, ok := exit.Sys().(syscall.WaitStatus); ok && status.Signaled() && status.Signal() == syscall.SIGKILL {
					why = "the guest's OOM killer: its kernel and agent do not fit this VM"
				}
			}
			return fmt.Errorf("the agent %s ended before the workload (%v; %s): its memory would not be in the "+
				"guest's used", path, err, why)
		case <-time.After(pollEvery):
		}
		now := residentKiB(command.Process.Pid)
		if now == resident && now > 0 {
			stable += pollEvery
		} else {
			resident, stable = now, 0
		}
		settled = stable >= agentSettled
	}
	say("agent path=%s rss_kib=%d settled=%s", path, resident, map[bool]string{true: "yes", false: "no"}[settled])
	select {
	case first := <-said:
		say("agent-said %s", first)
	default:
	}
	return nil
}

func mountImage(device, fstype, flags string) error {
	if err := os.MkdirAll(imageRoot, 0o755); err != nil {
		return err
	}
	if fstype == "" {
		fstype = "ext4"
	}
	if err := retry(deviceWait, func() error { _, err := os.Stat(device); return err }); err != nil {
		return fmt.Errorf("the image's root device %s did not appear: %v", device, err)
	}
	if err := syscall.Mount(device, imageRoot, fstype, syscall.MS_RDONLY, flags); err != nil {
		return fmt.Errorf("mounting the image's root %s (%s, %s): %v", device, fstype, flags, err)
	}
	// What the agent finds in a root Kata's init would have set up.
	for _, mount := range []struct{ source, target, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		if err := syscall.Mount(mount.source, imageRoot+mount.target, mount.fstype, 0, ""); err != nil {
			return fmt.Errorf("mounting %s in the image's root: %v", mount.target, err)
		}
	}
	return nil
}

// residentKiB is a process's VmRSS (kB), or -1.
func residentKiB(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			rest := strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:"))
			value, err := strconv.ParseInt(strings.TrimSuffix(rest, " kB"), 10, 64)
			if err == nil {
				return value
			}
		}
	}
	return -1
}
