//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-fleet/vigil/internal/supervisor"
)

// The supervisor cases measure in helper processes: each side (vigil's
// supervisor, the bare os/exec baseline) runs alone in a re-exec of the
// running binary, so that its RSS counts exactly its own heap, goroutine and
// OS thread stacks, and so that the supervisor's process-wide settings
// (child subreaper, SIGCHLD handler) never touch the bench process.
//
// A process started with supHelperEnv set runs the helper from this
// package's init and exits: the vigil binary and the bench test binary both
// link this package, so either can be re-executed as a helper without a
// command of its own.

// supHelperEnv holds a helper's supHelperConfig as JSON.
const supHelperEnv = "VIGIL_BENCH_SUPERVISOR_HELPER"

// supRunEnv marks every process a supervisor case starts, helpers and their
// children, with the case run's token, so that the case can find and kill
// anything left behind.
const supRunEnv = "VIGIL_BENCH_SUPERVISOR_RUN"

func init() {
	raw, ok := os.LookupEnv(supHelperEnv)
	if !ok {
		return
	}
	// Not inherited by the helper's own children.
	_ = os.Unsetenv(supHelperEnv)
	var cfg supHelperConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", supHelperEnv, err)
		os.Exit(2)
	}
	os.Exit(supHelperMain(cfg))
}

// supHelperConfig is one helper's job.
type supHelperConfig struct {
	// Mode is "restart" (measure restart latencies), "memory" (hold N
	// idle children, report RSS and idle CPU) or "child" (be the child
	// program: the fallback when no Go toolchain can build it).
	Mode string `json:"mode"`
	// Side is "supervisor" or "baseline" (restart and memory).
	Side string `json:"side,omitempty"`
	// Child is how to start the child program.
	Child supChild `json:"child"`
	// N is the restarts to measure, or the idle children to hold.
	N int `json:"n,omitempty"`
	// Settle is how long the memory helper waits, all children started,
	// before reading its RSS; Idle is the window its CPU time is measured
	// over after that.
	Settle time.Duration `json:"settle,omitempty"`
	Idle   time.Duration `json:"idle,omitempty"`
}

// supChild starts the child program: Argv plus the mode ("once" or
// "idle"), with Env added to the environment.
type supChild struct {
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env,omitempty"`
	// Static is true for the small binary built from
	// testdata/supervisor-child, false for the re-exec fallback.
	Static bool `json:"static"`
}

func (c supChild) command(mode string) []string {
	return append(append([]string(nil), c.Argv...), mode)
}

func (c supChild) environ() []string {
	env := os.Environ()
	for k, v := range c.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// supRestartResult is what the restart helper prints: one latency per
// restart, from the child's exit to its replacement's first line.
type supRestartResult struct {
	LatenciesNS []int64 `json:"latencies_ns"`
}

// supMemoryResult is what the memory helper prints.
type supMemoryResult struct {
	Children   int   `json:"children"`
	RSSKiB     int64 `json:"rss_kib"`      // VmRSS after Settle and Idle
	RSSGCKiB   int64 `json:"rss_gc_kib"`   // VmRSS after a forced GC that returns free memory to the OS
	Threads    int   `json:"threads"`      // OS threads of the helper
	Goroutines int   `json:"goroutines"`   // goroutines of the helper
	IdleCPUNS  int64 `json:"idle_cpu_ns"`  // user+system CPU over IdleNS, children idle
	IdleNS     int64 `json:"idle_ns"`      // the idle window
	StopNS     int64 `json:"stop_ns"`      // how long stopping every child took
	StopErrors int   `json:"stop_errors"`  // children that could not be signalled
	StartNS    int64 `json:"start_ns"`     // how long starting every child took
	FDs        int   `json:"fds"`          // open file descriptors
	Supervisor bool  `json:"supervisor"`   // which side
	Static     bool  `json:"static_child"` // the child was the small static binary
	// From runtime.MemStats with RSSKiB: goroutine and OS thread stacks
	// (StackInuse), the heap's spans in use (HeapInuse), and all the
	// runtime holds from the OS (Sys).
	StackInuseKiB int64 `json:"stack_inuse_kib"`
	HeapInuseKiB  int64 `json:"heap_inuse_kib"`
	SysKiB        int64 `json:"sys_kib"`
	StackGCKiB    int64 `json:"stack_gc_kib"` // StackInuse after the forced GC
}

// supHelperTimeout bounds anything a helper waits for.
const supHelperTimeout = 2 * time.Minute

func supHelperMain(cfg supHelperConfig) int {
	var out any
	var err error
	switch cfg.Mode {
	case "child":
		supChildMain(os.Args[1:])
		return 0
	case "restart":
		var lat []int64
		if cfg.Side == "supervisor" {
			lat, err = supRestartSupervisor(cfg)
		} else {
			lat, err = supRestartBaseline(cfg)
		}
		out = supRestartResult{LatenciesNS: lat}
	case "memory":
		if cfg.Side == "supervisor" {
			out, err = supMemorySupervisor(cfg)
		} else {
			out, err = supMemoryBaseline(cfg)
		}
	default:
		err = fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "supervisor bench helper (%s %s): %v\n", cfg.Mode, cfg.Side, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// supChildMain is testdata/supervisor-child's main, for the fallback.
func supChildMain(args []string) {
	mode := ""
	if len(args) > 0 {
		mode = args[0]
	}
	switch mode {
	case "once":
		line := strconv.AppendInt(make([]byte, 0, 24), time.Now().UnixNano(), 10)
		_, _ = os.Stdout.Write(append(line, '\n'))
		os.Exit(1)
	case "idle":
		for {
			time.Sleep(time.Hour)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: supervisor-child once|idle")
		os.Exit(2)
	}
}

// supLineClock records, for each line a child prints (its exit time, in
// Unix nanoseconds), that time and when the line arrived here.
type supLineClock struct {
	mu     sync.Mutex
	want   int
	exits  []int64 // the time each line carries
	recvs  []int64 // when each line arrived
	done   chan struct{}
	closed bool
	err    error
}

func newSupLineClock(want int) *supLineClock {
	return &supLineClock{want: want, done: make(chan struct{})}
}

// line records one line, without its newline, received at recv.
func (c *supLineClock) line(recv int64, text string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	// The supervisor prefixes "[agent] ".
	if i := strings.LastIndexByte(text, ' '); i >= 0 {
		text = text[i+1:]
	}
	ts, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
	if err != nil {
		c.err = fmt.Errorf("child line %q: %w", text, err)
		c.closed = true
		close(c.done)
		return
	}
	c.exits = append(c.exits, ts)
	c.recvs = append(c.recvs, recv)
	if len(c.exits) >= c.want {
		c.closed = true
		close(c.done)
	}
}

// Write takes the supervisor's output: one line per Write.
func (c *supLineClock) Write(p []byte) (int, error) {
	recv := time.Now().UnixNano()
	c.line(recv, strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// latencies are, for each line after the first, its arrival minus the
// previous child's exit.
func (c *supLineClock) latencies() ([]int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	var lat []int64
	for i := 1; i < len(c.exits); i++ {
		lat = append(lat, c.recvs[i]-c.exits[i-1])
	}
	return lat, nil
}

// supRestartPolicy makes the supervisor restart at once: a zero Min means
// the 5s default, so Min and Max are 1ns and jitter is off; the flap
// detector's window is 1ns, so that it never fires (it only reports, it
// never delays, but its event and log would be work a crash loop does not
// normally do on every exit).
var (
	supRestartBackoff = supervisor.BackoffPolicy{Min: time.Nanosecond, Max: time.Nanosecond, Jitter: supervisor.JitterOff}
	supRestartFlap    = supervisor.FlapPolicy{Window: time.Nanosecond}
)

// supRestartSupervisor lets a supervisor restart the "once" child N times
// and measures each restart.
func supRestartSupervisor(cfg supHelperConfig) ([]int64, error) {
	clock := newSupLineClock(cfg.N + 1)
	sup, err := supervisor.New(supervisor.Config{
		Agents:    []supervisor.Agent{{Name: "restart", Command: cfg.Child.command("once"), Env: cfg.Child.Env}},
		Backoff:   supRestartBackoff,
		Flapping:  supRestartFlap,
		StopGrace: time.Second,
		Logger:    slog.New(slog.DiscardHandler),
		Stdout:    clock,
		Stderr:    io.Discard,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- sup.Run(ctx) }()
	timeout := time.NewTimer(supHelperTimeout)
	defer timeout.Stop()
	select {
	case <-clock.done:
	case <-timeout.C:
		cancel()
		<-ran
		return nil, fmt.Errorf("%d restarts not seen within %s", cfg.N, supHelperTimeout)
	}
	cancel()
	if err := <-ran; err != nil {
		return nil, err
	}
	return clock.latencies()
}

// supRestartBaseline is the bare loop: start the child, read its line, wait
// for it, again.
func supRestartBaseline(cfg supHelperConfig) ([]int64, error) {
	clock := newSupLineClock(cfg.N + 1)
	argv := cfg.Child.command("once")
	env := cfg.Child.environ()
	for range cfg.N + 1 {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		cmd.Stdout = w
		err = cmd.Start()
		_ = w.Close()
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		line, err := bufio.NewReader(r).ReadString('\n')
		recv := time.Now().UnixNano()
		_ = cmd.Wait()
		_ = r.Close()
		if err != nil {
			return nil, fmt.Errorf("read the child's line: %w", err)
		}
		clock.line(recv, strings.TrimSuffix(line, "\n"))
	}
	return clock.latencies()
}

// supMemorySupervisor supervises N idle children and measures itself.
func supMemorySupervisor(cfg supHelperConfig) (supMemoryResult, error) {
	agents := make([]supervisor.Agent, cfg.N)
	for i := range agents {
		agents[i] = supervisor.Agent{Name: "idle-" + strconv.Itoa(i), Command: cfg.Child.command("idle"), Env: cfg.Child.Env}
	}
	sup, err := supervisor.New(supervisor.Config{
		Agents:    agents,
		StopGrace: 5 * time.Second,
		Logger:    slog.New(slog.DiscardHandler),
		Stdout:    io.Discard,
		Stderr:    io.Discard,
	})
	if err != nil {
		return supMemoryResult{}, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	start := time.Now()
	go func() { ran <- sup.Run(ctx) }()
	deadline := time.Now().Add(supHelperTimeout)
	for {
		running := 0
		for _, st := range sup.Status() {
			if st.Running {
				running++
			}
			if st.Restarts > 0 {
				cancel()
				<-ran
				return supMemoryResult{}, fmt.Errorf("agent %s restarted: %s", st.Name, st.LastExit)
			}
		}
		if running == cfg.N {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-ran
			return supMemoryResult{}, fmt.Errorf("%d of %d children running after %s", running, cfg.N, supHelperTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	res := supMeasureIdle(cfg, time.Since(start))
	res.Supervisor = true
	stopped := time.Now()
	cancel()
	if err := <-ran; err != nil {
		return res, err
	}
	res.StopNS = int64(time.Since(stopped))
	return res, nil
}

// supMemoryBaseline starts N idle children with os/exec, each in its own
// process group, and one goroutine blocked in cmd.Wait per child.
func supMemoryBaseline(cfg supHelperConfig) (supMemoryResult, error) {
	argv := cfg.Child.command("idle")
	env := cfg.Child.environ()
	var waits sync.WaitGroup
	var pids []int
	stop := func() int {
		failed := 0
		for _, pid := range pids {
			if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				failed++
			}
		}
		waits.Wait()
		return failed
	}
	start := time.Now()
	for range cfg.N {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			stop()
			return supMemoryResult{}, fmt.Errorf("start child %d: %w", len(pids), err)
		}
		pids = append(pids, cmd.Process.Pid)
		waits.Go(func() { _ = cmd.Wait() })
	}
	res := supMeasureIdle(cfg, time.Since(start))
	stopped := time.Now()
	res.StopErrors = stop()
	res.StopNS = int64(time.Since(stopped))
	return res, nil
}

// supMeasureIdle waits cfg.Settle, measures this process's CPU time over
// cfg.Idle, then reads its RSS, threads, goroutines and runtime memory
// statistics, and last its RSS after a forced GC that returns free memory
// to the OS.
func supMeasureIdle(cfg supHelperConfig, started time.Duration) supMemoryResult {
	time.Sleep(cfg.Settle)
	res := supMemoryResult{Children: cfg.N, StartNS: int64(started), Static: cfg.Child.Static}
	before := supCPUTime()
	t0 := time.Now()
	time.Sleep(cfg.Idle)
	res.IdleCPUNS = int64(supCPUTime() - before)
	res.IdleNS = int64(time.Since(t0))
	res.RSSKiB, res.Threads = supSelfStatus()
	res.Goroutines = runtime.NumGoroutine()
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		res.FDs = len(ents)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.StackInuseKiB, res.HeapInuseKiB, res.SysKiB = int64(ms.StackInuse>>10), int64(ms.HeapInuse>>10), int64(ms.Sys>>10)
	debug.FreeOSMemory()
	res.RSSGCKiB, _ = supSelfStatus()
	runtime.ReadMemStats(&ms)
	res.StackGCKiB = int64(ms.StackInuse >> 10)
	return res
}

// supSelfStatus reads VmRSS (KiB) and Threads from /proc/self/status.
func supSelfStatus() (rssKiB int64, threads int) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		name, val, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		fields := bytes.Fields(val)
		if len(fields) == 0 {
			continue
		}
		switch string(name) {
		case "VmRSS":
			rssKiB, _ = strconv.ParseInt(string(fields[0]), 10, 64)
		case "Threads":
			threads, _ = strconv.Atoi(string(fields[0]))
		}
	}
	return rssKiB, threads
}

// supCPUTime is this process's user + system CPU time (getrusage).
func supCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
