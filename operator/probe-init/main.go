// The init of the VMs `kata-sizing probe` and the node tests boot: PID 1 of an initramfs the probe
// writes. It loads the kernel modules the probe put in the initramfs (a guest kernel that builds its
// virtio drivers as modules; Kata's own builds them in, and gets none), starts the Kata agent of the
// guest image or initrd Kata boots (when the probe boots one) and waits until its memory settles,
// mounts the virtio-fs share virtiofsd serves, and reports what the guest's kernel left to userland
// with the agent running. Then a workload (a child process, since the kernel never OOM-kills PID 1),
// started from the share and first reading a file through it as a container reads its image's files,
// allocates and touches memory until it has its target or the guest refuses it, and the result is
// reported. Every report is one line starting with "KSP " on each console the kernel offers (ttyS0,
// hvc0), so the host reads it whatever the guest's kernel was built with. Parameters come from the
// kernel command line (ksp.*, and Kata's root=, rootfstype=, rootflags= for an image); see
// docs/probe.md for the protocol.
//
// The same binary is the workload (`workload` as its first argument) and, named kata-agent, the
// tests' stand-in for Kata's agent (standin.go).
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const mib = 1 << 20

var consoles []*os.File

func say(format string, args ...any) {
	line := "KSP " + fmt.Sprintf(format, args...) + "\n"
	for _, console := range consoles {
		console.WriteString(line)
	}
}

func openConsoles() {
	for _, console := range consoles {
		console.Close()
	}
	consoles = nil
	for _, name := range []string{"/dev/ttyS0", "/dev/hvc0"} {
		if f, err := os.OpenFile(name, os.O_WRONLY|syscall.O_NOCTTY, 0); err == nil {
			consoles = append(consoles, f)
		}
	}
	if len(consoles) == 0 {
		if f, err := os.OpenFile("/dev/console", os.O_WRONLY|syscall.O_NOCTTY, 0); err == nil {
			consoles = append(consoles, f)
		}
	}
}

// params reads ksp.<key>=<value> from the kernel command line, and the root= words Kata gives an image.
func params() map[string]string {
	found := map[string]string{}
	raw, _ := os.ReadFile("/proc/cmdline")
	for _, word := range strings.Fields(string(raw)) {
		key, value, ok := strings.Cut(word, "=")
		if !ok {
			continue
		}
		if strings.HasPrefix(key, "ksp.") {
			found[strings.TrimPrefix(key, "ksp.")] = value
		} else if key == "root" || key == "rootfstype" || key == "rootflags" {
			found[key] = value
		}
	}
	return found
}

func number(p map[string]string, key string, fallback int64) int64 {
	if text, ok := p[key]; ok {
		if value, err := strconv.ParseInt(text, 10, 64); err == nil && value >= 0 {
			return value
		}
		say("error ksp.%s=%q is not a whole number", key, text)
	}
	return fallback
}

// meminfo reports /proc/meminfo's figures (kB), as `free` reads them.
func meminfo(stage string) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		say("error reading /proc/meminfo: %v", err)
		return
	}
	fields := []string{}
	scanner := bufio.NewScanner(strings.NewReader(string(raw)))
	for scanner.Scan() {
		name, rest, ok := strings.Cut(scanner.Text(), ":")
		if !ok {
			continue
		}
		switch name {
		case "MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SReclaimable", "Shmem":
			fields = append(fields, name+"="+strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	say("meminfo stage=%s %s", stage, strings.Join(fields, " "))
}

// workload reads `data` (a file on the virtio-fs share, or none), then allocates `target` MiB (0: until
// refused) in steps of `step` MiB, touching every page, and writes the MiB it holds to stdout (a pipe to
// PID 1) after each step, waiting `stepMs` after each, and stays holding what it has when `linger` is set.
func workload(target, step, stepMs int64, linger bool, data string) {
	if data != "" {
		file, err := os.Open(data)
		if err != nil {
			os.Exit(4) // PID 1 says the share could not be read
		}
		read, err := io.Copy(io.Discard, file)
		file.Close()
		if err != nil {
			os.Exit(4)
		}
		// The first report is what was read, as a negative count of bytes.
		report := make([]byte, 8)
		binary.LittleEndian.PutUint64(report, uint64(-read))
		os.Stdout.Write(report)
	}
	held := int64(0)
	page := int64(os.Getpagesize())
	report := make([]byte, 8)
	var regions [][]byte
	for target == 0 || held < target {
		size := step
		if target != 0 && held+size > target {
			size = target - held
		}
		region, err := syscall.Mmap(-1, 0, int(size*mib), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			os.Exit(3) // the guest refused the mapping: PID 1 says how far it got
		}
		for offset := int64(0); offset < size*mib; offset += page {
			region[offset] = 1
		}
		regions = append(regions, region)
		held += size
		binary.LittleEndian.PutUint64(report, uint64(held))
		os.Stdout.Write(report)
		if stepMs > 0 {
			time.Sleep(time.Duration(stepMs) * time.Millisecond)
		}
	}
	if linger {
		for {
			time.Sleep(time.Hour)
		}
	}
	_ = regions
}

func main() {
	if filepath.Base(os.Args[0]) == standinName {
		standin()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "workload" {
		numbers := make([]int64, 3)
		for i := range numbers {
			numbers[i], _ = strconv.ParseInt(os.Args[2+i], 10, 64)
		}
		data := ""
		if len(os.Args) > 6 {
			data = os.Args[6]
		}
		workload(numbers[0], numbers[1], numbers[2], os.Args[5] == "1", data)
		return
	}
	syscall.Mount("proc", "/proc", "proc", 0, "")
	syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	syscall.Mount("sysfs", "/sys", "sysfs", 0, "")
	openConsoles()
	p := params()
	say("hello version=1")
	if loadModules() {
		openConsoles() // hvc0 exists once virtio_console is loaded
		say("hello version=1")
	}
	workloadBinary := "/init"
	data := ""
	if tag := p["share"]; tag != "" {
		mountpoint, err := mountShare(tag)
		if err != nil {
			say("error mounting the virtio-fs share %s: %v", tag, err)
			poweroff()
		}
		workloadBinary = filepath.Join(mountpoint, shareWorkload)
		data = filepath.Join(mountpoint, shareData)
		if _, err := os.Stat(data); err != nil {
			data = ""
		}
	}
	if agent := p["agent"]; agent != "" {
		if err := startAgent(agent, p); err != nil {
			say("error %v", err)
			poweroff()
		}
	}
	meminfo("boot")
	target := number(p, "alloc", 0)
	step := number(p, "step", 4)
	if step == 0 {
		step = 4
	}
	stepMs := number(p, "step_ms", 0)
	linger := p["linger"] == "1"
	say("workload target=%d step=%d", target, step)
	reader, writer, err := os.Pipe()
	if err != nil {
		say("error pipe: %v", err)
		poweroff()
	}
	child := exec.Command(workloadBinary, "workload", strconv.FormatInt(target, 10), strconv.FormatInt(step, 10),
		strconv.FormatInt(stepMs, 10), p["linger"], data)
	child.Stdout = writer
	if err := child.Start(); err != nil {
		say("error starting the workload %s: %v", workloadBinary, err)
		poweroff()
	}
	writer.Close()
	held := int64(0)
	reported := int64(0)
	buffer := make([]byte, 8)
	for {
		if _, err := io.ReadFull(reader, buffer); err != nil {
			break
		}
		figure := int64(binary.LittleEndian.Uint64(buffer))
		if figure < 0 {
			say("share read=%d", -figure)
			continue
		}
		held = figure
		if held-reported >= 64 || (target != 0 && held == target) {
			say("progress held=%d", held)
			reported = held
		}
		if linger && target != 0 && held == target {
			say("done held=%d outcome=reached", held)
			meminfo("workload")
			reported = -1 << 62
		}
	}
	state, _ := child.Process.Wait()
	outcome := "reached"
	if status, ok := state.Sys().(syscall.WaitStatus); ok && status.Signaled() {
		outcome = "killed"
	} else if state.ExitCode() == 3 {
		outcome = "refused"
	} else if state.ExitCode() == 4 {
		say("error the workload could not read %s through the virtio-fs share", data)
		poweroff()
	} else if state.ExitCode() != 0 {
		outcome = fmt.Sprintf("exit-%d", state.ExitCode())
	}
	say("done held=%d outcome=%s", held, outcome)
	meminfo("after")
	if linger {
		// What the guest touched stays in the VM's memory (its file on the host) while it runs.
		for {
			time.Sleep(time.Hour)
		}
	}
	poweroff()
}

func poweroff() {
	say("bye")
	for _, console := range consoles {
		console.Sync()
	}
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	for {
		time.Sleep(time.Hour)
	}
}
