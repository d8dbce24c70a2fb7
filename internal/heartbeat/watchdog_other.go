//go:build !linux

package heartbeat

import "errors"

// errNoProc: the watchdog needs /proc.
var errNoProc = errors.New("the heartbeat watchdog needs Linux /proc")

// Scan is not supported without /proc.
func Scan() ([]LoopProcess, error) { return nil, errNoProc }

// Sweep is not supported without /proc.
func Sweep(roots []string, dryRun bool) ([]SweepReport, error) { return nil, errNoProc }
