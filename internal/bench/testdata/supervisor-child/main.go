// Command supervisor-child is the child process of the supervisor benchmarks
// (internal/bench/supervisor.go). The bench writes this file into its scratch
// directory and builds it there: a small static binary that starts in about
// a millisecond, so that the restart figure is the supervisor's, not the
// child's start-up.
//
//	supervisor-child once   prints the time (Unix nanoseconds) and exits 1
//	supervisor-child idle   prints nothing and blocks until killed
//
// It uses no fmt, to keep its start-up short.
package main

import (
	"os"
	"strconv"
	"time"
)

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "once":
		// The time is taken just before the one write and the exit: the
		// replacement's latency is measured from it.
		line := strconv.AppendInt(make([]byte, 0, 24), time.Now().UnixNano(), 10)
		_, _ = os.Stdout.Write(append(line, '\n'))
		os.Exit(1)
	case "idle":
		for {
			time.Sleep(time.Hour)
		}
	default:
		_, _ = os.Stderr.WriteString("usage: supervisor-child once|idle\n")
		os.Exit(2)
	}
}
