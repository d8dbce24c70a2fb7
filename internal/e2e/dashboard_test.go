package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// chromium finds the browser for the dashboard test: $VIGIL_CHROMIUM, else
// chromium or google-chrome on PATH. Without one the test is skipped, but
// under CI=true it fails: .ci/run installs Debian's chromium.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("VIGIL_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH under CI=true: .ci/run must install it (apt-get install -y chromium)")
	}
	t.Skip("no chromium on PATH (apt-get install -y chromium, or set VIGIL_CHROMIUM)")
	return ""
}

// browser starts headless Chromium for the rest of the test, with extra
// options on top of the defaults.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // root in a container
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	opts = append(opts, extra...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

// The dashboard, in a real browser against a server with real workers,
// shows a worker killed with SIGKILL turn from alive to stopped without a
// reload, and the page is saved as a screenshot ($VIGIL_DASHBOARD_SCREENSHOT,
// which is how docs/dashboard.png is made).
func TestDashboardShowsKilledWorkerStoppedWithoutReload(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	url := startServer(t, "--sweep-interval", "200ms")
	var agent vigiltype.Agent
	vigil(t, url, &agent, "agents", "register", "worker", "--function", "example worker")
	workers := startWorkers(t, url, 3, workerEnv(url, "1s", "1s")) // alive window 3s
	enqueue(t, url, `{"seconds":60}`)
	// History for the strips and the Events card: a crash, a stall kill, and
	// an agent registered with nothing running (down).
	for _, ev := range []string{
		`{"agent":"worker","kind":"exit","exit_code":3,"run_duration_ms":4200,"stderr_tail":"panic: lost connection\n"}`,
		`{"agent":"worker","kind":"stall_kill","signal":"SIGKILL","run_duration_ms":1800}`,
	} {
		resp, err := http.Post(url+"/v1/events", "application/json", strings.NewReader(ev))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	vigil(t, url, &agent, "agents", "register", "critic", "--function", "reviews drafts")

	var victimPID int
	for pid := range workers {
		victimPID = pid
		break
	}
	var victim string
	for id, p := range processes(t, url) {
		if p.PID == victimPID && p.Status == vigiltype.ProcessAlive {
			victim = id
		}
	}
	require.NotEmpty(t, victim)
	row := `#card-processes tr[data-instance="` + victim + `"]`

	// The first Run starts the browser and must not carry a timeout (it
	// would stop the browser); later steps are bounded.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url+"/?interval=0.5")))
	wait, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(wait,
		chromedp.WaitVisible(row+`[data-status="alive"]`),
		chromedp.WaitVisible(`#card-agents tr[data-agent="worker"] svg.strip rect.up`),
		chromedp.WaitVisible(`#card-tasks tr[data-task]`),
		chromedp.WaitVisible(`#card-sweepers tr[data-sweeper]`),
		chromedp.WaitVisible(`#card-agents tr[data-agent="worker"] svg.strip rect.mark.exit`),
		chromedp.WaitVisible(`#card-agents tr[data-agent="worker"] svg.strip rect.mark.stall`),
		chromedp.WaitVisible(`#card-agents tr[data-agent="critic"][data-operational="down"]`),
		chromedp.WaitVisible(`#card-events tr[data-event]`),
	))
	loadBefore, err := chromedp.Run(wait, chromedp.Evaluate[string](`window.vigilLoadId`))
	require.NoError(t, err)
	require.NotEmpty(t, loadBefore)

	require.NoError(t, syscall.Kill(victimPID, syscall.SIGKILL))
	require.NoError(t, chromedp.Do(wait, chromedp.WaitVisible(row+`[data-status="stopped"]`)))
	loadAfter, err := chromedp.Run(wait, chromedp.Evaluate[string](`window.vigilLoadId`))
	require.NoError(t, err)
	require.Equal(t, loadBefore, loadAfter, "the page changed without a reload")
	shot, err := chromedp.Run(wait, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(shot, []byte("\x89PNG")), "a PNG screenshot")

	out := os.Getenv("VIGIL_DASHBOARD_SCREENSHOT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "dashboard.png")
	}
	require.NoError(t, os.WriteFile(out, shot, 0o644))
	t.Logf("screenshot: %s (%s bytes)", out, strconv.Itoa(len(shot)))
}

// With 1,000 process instances over 25 kinds the page stays readable: kinds
// past the first six start folded, an open kind shows its newest ten rows
// until "show all" is pressed, and the filter narrows to one kind.
func TestDashboardStaysReadableWithThousandProcesses(t *testing.T) {
	t.Parallel()
	ctx := browser(t)
	url := startServer(t)
	for i := range 1000 {
		body := fmt.Sprintf(`{"process_kind":"kind-%02d","hostname":"host-%d","pid":%d,"liveness_interval_s":600}`, i%25, i%7, 10000+i)
		resp, err := http.Post(url+"/v1/processes", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url+"/")))
	wait, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(wait, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
		require.NoError(t, err)
		return n
	}
	require.NoError(t, chromedp.Do(wait, chromedp.WaitVisible(`details[data-kind="kind-24"]`)))
	require.Equal(t, 25, count(`details[data-kind]`))
	require.Equal(t, 6, count(`details[data-kind][open]`), "a big fleet starts folded")
	require.Equal(t, 25*10, count(`tr[data-instance]`), "ten rows per kind until asked for more")

	require.NoError(t, chromedp.Do(wait, chromedp.Click(`details[data-kind="kind-24"] button.more`)))
	require.Equal(t, 40, count(`details[data-kind="kind-24"] tr[data-instance]`), "show all: the newest kind's 40 instances")

	require.NoError(t, chromedp.Do(wait, chromedp.SendKeys(`#proc-filter`, "kind-07")))
	require.Equal(t, 1, count(`details[data-kind]`))

	// An interval setTimeout cannot take (it would read it as 0 and flood
	// the server) is refused and said so; the page polls at its default.
	require.NoError(t, chromedp.Do(wait,
		chromedp.Navigate(url+"/?interval=1e400"),
		chromedp.WaitVisible(`#error`),
		chromedp.Sleep(2*time.Second), // the assertion is a count of requests over time
	))
	banner, err := chromedp.Run(wait, chromedp.Evaluate[string](`document.getElementById("error").textContent`))
	require.NoError(t, err)
	require.Contains(t, banner, "is not a number of seconds between 0.5 and 3600")
	polls, err := chromedp.Run(wait, chromedp.Evaluate[int](
		`performance.getEntriesByType("resource").filter((e) => e.name.includes("/v1/sweepers")).length`))
	require.NoError(t, err)
	require.LessOrEqual(t, polls, 3, "polling at the 3 s default, not in a loop (a flood makes hundreds)")
	require.GreaterOrEqual(t, polls, 1)
}
