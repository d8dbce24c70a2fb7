package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// hbStats is what one measured phase reached: how many operations finished
// in how long, and their latencies sorted ascending.
type hbStats struct {
	N         int
	Errors    int
	Elapsed   time.Duration
	Latencies []time.Duration // sorted
	FirstErr  error
	Unsent    int // open loop: scheduled requests never sent
}

// Rate is completed operations per second.
func (s hbStats) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.N) / s.Elapsed.Seconds()
}

// Quantile is the q-quantile latency (nearest rank), 0 with no samples.
func (s hbStats) Quantile(q float64) time.Duration {
	if len(s.Latencies) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(s.Latencies)))) - 1
	return s.Latencies[min(max(i, 0), len(s.Latencies)-1)]
}

// Summary is "31,200/s, p50 1.2 ms, p99 4.1 ms".
func (s hbStats) Summary() string {
	return fmt.Sprintf("%s/s, p50 %s, p99 %s", hbThousands(s.Rate()), hbMS(s.Quantile(0.5)), hbMS(s.Quantile(0.99)))
}

// hbThousands formats f rounded to an integer with thousands separators.
func hbThousands(f float64) string {
	s := strconv.FormatInt(int64(math.Round(f)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// hbMS formats a latency in milliseconds with two significant decimals
// below 10 ms.
func hbMS(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 1:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// hbClosedLoop runs op from clients goroutines back to back: a warm-up of
// warm (not counted), then dur measured. op gets a sequence number unique
// across goroutines. An op that returns an error is counted as an error,
// not as a completion.
func hbClosedLoop(ctx context.Context, clients int, warm, dur time.Duration, op func(ctx context.Context, seq int64) error) hbStats {
	var (
		seq      atomic.Int64
		measured atomic.Bool
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      hbStats
	)
	for range clients {
		wg.Go(func() {
			var (
				lat      []time.Duration
				errs     int
				firstErr error
			)
			for !stop.Load() && ctx.Err() == nil {
				counted := measured.Load()
				start := time.Now()
				err := op(ctx, seq.Add(1))
				if !counted || stop.Load() {
					continue
				}
				if err != nil {
					errs++
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				lat = append(lat, time.Since(start))
			}
			mu.Lock()
			all.Latencies = append(all.Latencies, lat...)
			all.Errors += errs
			if all.FirstErr == nil {
				all.FirstErr = firstErr
			}
			mu.Unlock()
		})
	}
	hbSleep(ctx, warm)
	measured.Store(true)
	start := time.Now()
	hbSleep(ctx, dur)
	stop.Store(true)
	all.Elapsed = time.Since(start)
	wg.Wait()
	slices.Sort(all.Latencies)
	all.N = len(all.Latencies)
	return all
}

// hbSleep waits d or until ctx ends.
func hbSleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// hbHTTPClient is a client that keeps up to conns connections to one host
// open between requests.
func hbHTTPClient(conns int) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			MaxConnsPerHost:     conns,
			IdleConnTimeout:     time.Minute,
		},
	}
}

// hbPost sends one liveness heartbeat for instance id and checks the 200.
func hbPost(ctx context.Context, c *http.Client, baseURL, id, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/processes/"+id+"/heartbeat", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Vigil-Instance-Token", token)
	return hbDo(c, req)
}

// hbDo sends req and wants a 200; the body is read to the end so the
// connection is reused.
func hbDo(c *http.Client, req *http.Request) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}
