module kata-sizing.dev/probe-init

go 1.19
