//go:build linux

package bench

import (
	"bytes"
	"context"
	crand "crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The supervisor's rows (issue #6):
//
//   - "restart": crash → restart with the backoff minimum at (effectively)
//     0, from the child's exit to its replacement's first output line,
//     against a bare Go start/wait loop on the same child;
//   - "supervisor-memory": RSS per idle child (the slope from few to many
//     children) and CPU while they idle, against bare os/exec with one
//     blocked Wait per child.
//
// Both sides of both rows run in helper processes (supervisor_helper.go).
func init() {
	register(Case{Name: "restart", Run: runSupervisorRestart})
	register(Case{Name: "supervisor-memory", Run: runSupervisorMemory})
}

//go:embed testdata/supervisor-child/main.go
var supChildSource []byte

// supChildBuilds caches the child built into each scratch directory.
var supChildBuilds sync.Map // Env.Dir → supChild

// supBuildChild builds testdata/supervisor-child into env.Dir once, as a
// static binary (CGO_ENABLED=0). Without a Go toolchain it falls back to
// re-executing this binary in its child mode: the same behaviour, a slower
// start-up.
func supBuildChild(ctx context.Context, env Env) (supChild, error) {
	if c, ok := supChildBuilds.Load(env.Dir); ok {
		return c.(supChild), nil
	}
	child, err := supBuildStaticChild(ctx, env)
	if err != nil {
		env.Logf("supervisor bench: cannot build the static child (%v); re-executing this binary instead", err)
		self, err := os.Executable()
		if err != nil {
			return supChild{}, fmt.Errorf("find this binary: %w", err)
		}
		cfg, _ := json.Marshal(supHelperConfig{Mode: "child"})
		child = supChild{Argv: []string{self}, Env: map[string]string{supHelperEnv: string(cfg)}}
	}
	supChildBuilds.Store(env.Dir, child)
	return child, nil
}

func supBuildStaticChild(ctx context.Context, env Env) (supChild, error) {
	gobin, err := exec.LookPath("go") // none: the caller re-runs this binary as the child
	if err != nil {
		return supChild{}, err
	}
	dir := filepath.Join(env.Dir, "supervisor-child")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return supChild{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), supChildSource, 0o644); err != nil {
		return supChild{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module supervisorchild\n\ngo 1.22\n"), 0o644); err != nil {
		return supChild{}, err
	}
	bin := filepath.Join(dir, "supervisor-child")
	cmd := exec.CommandContext(ctx, gobin, "build", "-trimpath", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return supChild{}, fmt.Errorf("go build: %w: %s", err, bytes.TrimSpace(out))
	}
	return supChild{Argv: []string{bin}, Static: true}, nil
}

// supRunHelper runs one helper process and decodes what it prints into out.
// Every process it starts carries a token of its own (supRunEnv); once the
// helper has exited, any such process still running is killed, and is an
// error: the helper must clean up after itself.
func supRunHelper(ctx context.Context, cfg supHelperConfig, out any) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary: %w", err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	token := supNewToken()
	ctx, cancel := context.WithTimeout(ctx, 2*supHelperTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), supHelperEnv+"="+string(raw), supRunEnv+"="+token)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if left := supKillLeftovers(token); left > 0 && runErr == nil {
		runErr = fmt.Errorf("%d process(es) left behind (killed)", left)
	}
	if runErr != nil {
		return fmt.Errorf("helper %s/%s: %w: %s", cfg.Mode, cfg.Side, runErr, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("helper %s/%s output: %w", cfg.Mode, cfg.Side, err)
	}
	return nil
}

// supTokenPrefix starts every token of this process, so that a test can
// look for anything any of its runs left behind.
var supTokenPrefix = strconv.Itoa(os.Getpid()) + "-" + crand.Text()[:8] + "-"

var supTokenSeq struct {
	sync.Mutex
	n int
}

func supNewToken() string {
	supTokenSeq.Lock()
	defer supTokenSeq.Unlock()
	supTokenSeq.n++
	return supTokenPrefix + strconv.Itoa(supTokenSeq.n)
}

// supMarkedPIDs lists the live processes whose environment has
// supRunEnv=<a value starting with prefix>.
func supMarkedPIDs(prefix string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte(supRunEnv + "=" + prefix)
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
			continue
		}
		environ, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(environ, []byte{0}) {
			if bytes.HasPrefix(kv, want) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// supKillLeftovers SIGKILLs every live process marked with token (and its
// group, when it leads one), waits up to 5s for them to go, and returns how
// many there were.
func supKillLeftovers(token string) int {
	pids := supMarkedPIDs(token)
	for _, pid := range pids {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if len(supMarkedPIDs(token)) == 0 {
			break
		}
	}
	return len(pids)
}

// supHostPIDs lists every process under /proc (the host's process
// count, for the notes).
func supHostPIDs() []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// supQuantile is the q-quantile (nearest rank) of sorted.
func supQuantile(sorted []int64, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return time.Duration(sorted[min(max(i, 0), len(sorted)-1)])
}

func supMS(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + " ms"
}

// supRestartTarget is the restart row's target (issue #6).
const (
	supRestartP50Max   = 5 * time.Millisecond
	supRestartRatioMax = 1.5
)

// runSupervisorRestart measures the "restart" row.
func runSupervisorRestart(ctx context.Context, env Env) ([]Row, error) {
	child, err := supBuildChild(ctx, env)
	if err != nil {
		return nil, err
	}
	n := 2000
	if env.Smoke {
		n = 20
	}
	// Alternate the sides in rounds, so that a noisy neighbour hits both.
	rounds := 2
	if env.Smoke {
		rounds = 1
	}
	var sup, base []int64
	for round := range rounds {
		for _, side := range []string{"baseline", "supervisor"} {
			env.Logf("restart: round %d, %s, %d restarts", round+1, side, n/rounds)
			var res supRestartResult
			if err := supRunHelper(ctx, supHelperConfig{Mode: "restart", Side: side, Child: child, N: n / rounds}, &res); err != nil {
				return nil, err
			}
			if len(res.LatenciesNS) == 0 {
				return nil, fmt.Errorf("restart %s: no restart measured", side)
			}
			if side == "supervisor" {
				sup = append(sup, res.LatenciesNS...)
			} else {
				base = append(base, res.LatenciesNS...)
			}
		}
	}
	slices.Sort(sup)
	slices.Sort(base)
	sp50, sp99 := supQuantile(sup, 0.5), supQuantile(sup, 0.99)
	bp50, bp99 := supQuantile(base, 0.5), supQuantile(base, 0.99)
	ratio := float64(sp50) / float64(bp50)
	row := Row{
		Path:     "crash → restart, backoff minimum set to 0",
		Figure:   fmt.Sprintf("p50 %s, p99 %s (%d restarts)", supMS(sp50), supMS(sp99), len(sup)),
		Baseline: fmt.Sprintf("bare Go start/wait loop: p50 %s, p99 %s (%d restarts)", supMS(bp50), supMS(bp99), len(base)),
		Ratio:    ratio,
		Target:   "p50 ≤ 5 ms; ≤ 1.5× at p50",
		Met:      sp50 <= supRestartP50Max && ratio <= supRestartRatioMax,
	}
	childNote := "the child is a small static Go binary that prints its exit time and exits 1"
	if !child.Static {
		childNote = "the child is this binary re-executed (no Go toolchain to build the small static one), so start-up weighs on both sides"
	}
	row.Note = "Measured from the time the child prints just before exiting to the replacement's line reaching the supervisor's Stdout; " +
		childNote + ". Backoff Min = Max = 1ns with jitter off (a zero Min means the 5s default) and a 1ns flap window " +
		"(the flap detector only reports, never delays; the defaults are unchanged)."
	if ratio > supRestartRatioMax {
		row.Note += fmt.Sprintf(" Misses the ratio: after every exit the supervisor scans /proc once (%d processes on this host) "+
			"for the generation's leftovers, which DESIGN S3 stops before the restart; the scan is most of the gap and grows with "+
			"the host's process count. A cgroup per agent (cgroup.events tells when the generation is empty) would replace it.",
			len(supHostPIDs()))
	}
	return []Row{row}, nil
}

// The memory row's target (issue #6).
const (
	supMemSlopeMaxKiB = 16.0
	supMemRatioMax    = 0.6
	// supIdleCPUMax is the CPU share that still counts as zero: 0.1% of
	// one core (the Go runtime's own housekeeping, no polling loop).
	supIdleCPUMax = 0.001
)

// runSupervisorMemory measures the "supervisor-memory" row.
func runSupervisorMemory(ctx context.Context, env Env) ([]Row, error) {
	child, err := supBuildChild(ctx, env)
	if err != nil {
		return nil, err
	}
	lo, hi := 100, 1000
	settle, idle := time.Second, 5*time.Second
	if env.Smoke {
		lo, hi = 20, 120
		settle, idle = 100*time.Millisecond, 300*time.Millisecond
	}
	if err := supCheckProcessLimit(7*hi + 100); err != nil {
		return nil, err
	}
	measure := func(side string, n int) (supMemoryResult, error) {
		env.Logf("supervisor-memory: %s with %d idle children", side, n)
		var res supMemoryResult
		err := supRunHelper(ctx, supHelperConfig{Mode: "memory", Side: side, Child: child, N: n, Settle: settle, Idle: idle}, &res)
		if err == nil {
			env.Logf("supervisor-memory: %s %d: rss %d KiB (%d KiB after GC; stacks %d (%d after GC), heap %d, sys %d KiB), %d threads, %d goroutines, %d fds, idle CPU %s over %s, start %s, stop %s",
				side, n, res.RSSKiB, res.RSSGCKiB, res.StackInuseKiB, res.StackGCKiB, res.HeapInuseKiB, res.SysKiB, res.Threads, res.Goroutines, res.FDs,
				time.Duration(res.IdleCPUNS), time.Duration(res.IdleNS).Round(time.Millisecond),
				time.Duration(res.StartNS).Round(time.Millisecond), time.Duration(res.StopNS).Round(time.Millisecond))
		}
		return res, err
	}
	var got [2][2]supMemoryResult // [baseline, supervisor][lo, hi]
	for s, side := range []string{"baseline", "supervisor"} {
		for k, n := range []int{lo, hi} {
			if got[s][k], err = measure(side, n); err != nil {
				return nil, err
			}
		}
	}
	slope := func(r [2]supMemoryResult) float64 {
		return float64(r[1].RSSKiB-r[0].RSSKiB) / float64(hi-lo)
	}
	baseSlope, supSlope := slope(got[0]), slope(got[1])
	if baseSlope <= 0 {
		return nil, fmt.Errorf("baseline RSS did not grow from %d to %d children (%d → %d KiB)", lo, hi, got[0][0].RSSKiB, got[0][1].RSSKiB)
	}
	ratio := supSlope / baseSlope
	supIdle, baseIdle := got[1][1], got[0][1]
	cpuShare := float64(supIdle.IdleCPUNS) / float64(supIdle.IdleNS)
	row := Row{
		Path: fmt.Sprintf("supervisor memory per idle child (RSS slope %d → %d children) and CPU while they idle", lo, hi),
		Figure: fmt.Sprintf("%.1f KiB/child (%d → %d KiB, %d → %d threads); idle CPU %s over %s at %d children (%.2f%% of a core)",
			supSlope, got[1][0].RSSKiB, got[1][1].RSSKiB, got[1][0].Threads, got[1][1].Threads,
			supMS(time.Duration(supIdle.IdleCPUNS)), time.Duration(supIdle.IdleNS).Round(time.Millisecond), hi, 100*cpuShare),
		Baseline: fmt.Sprintf("bare os/exec + one blocked Wait per child: %.1f KiB/child (%d → %d KiB, %d → %d threads); idle CPU %s",
			baseSlope, got[0][0].RSSKiB, got[0][1].RSSKiB, got[0][0].Threads, got[0][1].Threads,
			supMS(time.Duration(baseIdle.IdleCPUNS))),
		Ratio:  ratio,
		Target: "≤ 16 KiB/child; zero CPU while idle; ≤ 0.6× slope",
		Met:    supSlope <= supMemSlopeMaxKiB && ratio <= supMemRatioMax && cpuShare <= supIdleCPUMax,
	}
	row.Note = fmt.Sprintf("Each side runs alone in a re-exec of this binary; RSS is its VmRSS %s after the last child started, at the end of the idle window "+
		"(after a forced GC: supervisor %.1f, baseline %.1f KiB/child). Zero CPU means ≤ %.1f%% of a core. ",
		settle+idle, float64(got[1][1].RSSGCKiB-got[1][0].RSSGCKiB)/float64(hi-lo),
		float64(got[0][1].RSSGCKiB-got[0][0].RSSGCKiB)/float64(hi-lo), 100*supIdleCPUMax)
	row.Note += fmt.Sprintf("Per child the supervisor holds one goroutine and its descriptors (threads %d, goroutines %d at %d children); "+
		"the baseline holds an OS thread in a blocked Wait. ", got[1][1].Threads, got[1][1].Goroutines, hi)
	if cpuShare > supIdleCPUMax {
		row.Note += fmt.Sprintf("Idle CPU misses zero: it is the reaper's once-a-second scan of /proc (%.2f%% of a core at %d children, %.2f%% at %d), "+
			"which finds setsid()'ed descendants alive so that they can be reaped once orphaned; it grows with the host's processes. "+
			"A cgroup per agent (the kernel tracks membership) would replace the scan; a longer reap interval would only thin it.",
			100*cpuShare, hi, 100*float64(got[1][0].IdleCPUNS)/float64(got[1][0].IdleNS), lo)
	}
	return []Row{row}, nil
}

// supCheckProcessLimit fails early when RLIMIT_NPROC (ulimit -u) leaves no
// room for need more processes and threads.
func supCheckProcessLimit(need int) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &lim); err != nil {
		return nil // unknown: try
	}
	if lim.Cur != ^uint64(0) && lim.Cur < uint64(need) {
		return errors.New("ulimit -u is " + strconv.FormatUint(lim.Cur, 10) + ", below the " + strconv.Itoa(need) + " processes and threads this case needs")
	}
	return nil
}
