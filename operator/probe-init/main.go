// The init of the VMs `kata-sizing probe` and the node tests boot: PID 1 of an initramfs the probe
// writes. It reports what the guest's kernel left to userland, then a workload (a child process,
// since the kernel never OOM-kills PID 1) allocates and touches memory until it has its target or
// the guest refuses it, and the result is reported. Every report is one line starting with "KSP "
// on each console the kernel offers (ttyS0, hvc0), so the host reads it whatever the guest's
// kernel was built with. Parameters come from the kernel command line (ksp.*); see
// docs/probe.md for the protocol.
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// params reads ksp.<key>=<value> from the kernel command line.
func params() map[string]string {
	found := map[string]string{}
	raw, _ := os.ReadFile("/proc/cmdline")
	for _, word := range strings.Fields(string(raw)) {
		if key, value, ok := strings.Cut(word, "="); ok && strings.HasPrefix(key, "ksp.") {
			found[strings.TrimPrefix(key, "ksp.")] = value
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

// workload allocates `target` MiB (0: until refused) in steps of `step` MiB, touching every page,
// and writes the MiB it holds to stdout (a pipe to PID 1) after each step, waiting `stepMs` after
// each, and stays holding what it has when `linger` is set.
func workload(target, step, stepMs int64, linger bool) {
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
	if len(os.Args) > 1 && os.Args[1] == "workload" {
		numbers := make([]int64, 3)
		for i := range numbers {
			numbers[i], _ = strconv.ParseInt(os.Args[2+i], 10, 64)
		}
		workload(numbers[0], numbers[1], numbers[2], os.Args[5] == "1")
		return
	}
	syscall.Mount("proc", "/proc", "proc", 0, "")
	syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	openConsoles()
	p := params()
	say("hello version=1")
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
	child := exec.Command("/init", "workload", strconv.FormatInt(target, 10), strconv.FormatInt(step, 10),
		strconv.FormatInt(stepMs, 10), p["linger"])
	child.Stdout = writer
	if err := child.Start(); err != nil {
		say("error starting the workload: %v", err)
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
		held = int64(binary.LittleEndian.Uint64(buffer))
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
