package main

// The tests' stand-in for Kata's agent, which no registry serves where the project is tested: this
// binary named kata-agent in a guest image or initrd the tests build. It holds a stated amount of
// memory, as the agent holds its own once started, says so on its output (which the init reports),
// and waits, as the agent waits for the shim. It speaks no ttrpc: it stands in for the agent's memory
// only (docs/probe.md says which figures are real where).

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

const (
	standinName = "kata-agent"
	// What the stand-in holds, MiB: the tests' stated figure for an agent (docs/probe.md).
	standinHeldMiB = 24
)

func standin() {
	region, err := syscall.Mmap(-1, 0, standinHeldMiB*mib, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		fmt.Printf("kata-sizing stand-in agent: could not map %d MiB: %v\n", standinHeldMiB, err)
		os.Exit(1)
	}
	for offset := 0; offset < len(region); offset += os.Getpagesize() {
		region[offset] = 1
	}
	fmt.Printf("kata-sizing stand-in agent: holding %d MiB\n", standinHeldMiB)
	for {
		time.Sleep(time.Hour)
	}
}
