// Package metrics exposes vigil's Prometheus metrics at /metrics: what the
// server sees (heartbeats by schema version, claims, reclaims, process
// events by kind, HTTP latency), what an in-process supervisor does
// (restarts and stall kills by agent) and, read from the store at scrape
// time, how many process instances of each kind are alive or stopped.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vigil-fleet/vigil/internal/clock"
	"github.com/vigil-fleet/vigil/internal/store"
)

// scrapeTimeout bounds the store read of one scrape.
const scrapeTimeout = 5 * time.Second

// Metrics holds vigil's collectors on a registry of its own.
type Metrics struct {
	registry *prometheus.Registry

	// Heartbeats counts heartbeats received, by type ("liveness" or
	// "lease") and schema_version ("1" or "2"; liveness is always "1").
	Heartbeats *prometheus.CounterVec
	// LeasesClaimed counts successful claims.
	LeasesClaimed prometheus.Counter
	// LeasesReclaimed counts leases taken back by the reclaimer or after a
	// stall kill.
	LeasesReclaimed prometheus.Counter
	// Events counts process events recorded, by kind (exit, stall_kill,
	// launch_failure, flapping, startup_timeout); exits are restarts.
	Events *prometheus.CounterVec
	// HTTP observes request latency by method, route pattern and status code.
	HTTP *prometheus.HistogramVec
	// Restarts counts an in-process supervisor's relaunches of an agent
	// after its process ended (exit, kill, failed launch), by agent; the
	// first launch is not a restart. See Restarted.
	Restarts *prometheus.CounterVec
	// StallKills counts an in-process supervisor's stall kills (DESIGN S4),
	// by agent; a stall deferred by the kill budget is not one. See
	// StallKilled.
	StallKills *prometheus.CounterVec
	// ApprovalCheckFailures counts an in-process supervisor's
	// pending-approval checks that failed (a missing or hung command, an
	// exit code other than 0 or 1) and so failed open. See
	// ApprovalCheckFailed.
	ApprovalCheckFailures prometheus.Counter
}

// New builds the collectors; the processes gauge reads st at scrape time
// with clk's now (so it agrees with the API's computed status).
func New(st store.Store, clk clock.Clock, logger *slog.Logger) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		Heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_heartbeats_received_total",
			Help: "Heartbeats received, by type (liveness, lease) and schema version.",
		}, []string{"type", "schema_version"}),
		LeasesClaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_leases_claimed_total",
			Help: "Task leases claimed.",
		}),
		LeasesReclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_leases_reclaimed_total",
			Help: "Task leases taken back from holders that died, went silent or stalled.",
		}),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_process_events_total",
			Help: "Process events recorded, by kind (exit, stall_kill, launch_failure, flapping, startup_timeout).",
		}, []string{"kind"}),
		HTTP: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vigil_http_request_duration_seconds",
			Help:    "HTTP API request latency, by method, route pattern and status code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"method", "route", "code"}),
		// The agent label is bounded: agents are the fleet file's and the
		// registry's names, not anything a client makes up per request.
		Restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_restarts_total",
			Help: "Agent processes relaunched by the supervisor after an exit, kill or failed launch, by agent.",
		}, []string{"agent"}),
		StallKills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_stall_kills_total",
			Help: "Agent processes killed by the supervisor for a task running past stall_after, by agent.",
		}, []string{"agent"}),
		ApprovalCheckFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_stall_approval_check_failures_total",
			Help: "Pending-approval checks that failed (missing or hung command, exit code other than 0 or 1); each failed open: no stall kill.",
		}),
	}
	m.registry.MustRegister(m.Heartbeats, m.LeasesClaimed, m.LeasesReclaimed, m.Events, m.HTTP, m.Restarts, m.StallKills, m.ApprovalCheckFailures,
		&processCollector{store: st, clock: clk, logger: logger},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// ApprovalCheckFailed counts one failed pending-approval check: the
// signature of supervisor.Config.ApprovalCheckFailed.
func (m *Metrics) ApprovalCheckFailed() { m.ApprovalCheckFailures.Inc() }

// Restarted counts one restart of agent: the signature of
// supervisor.Config.Restarted.
func (m *Metrics) Restarted(agent string) { m.Restarts.WithLabelValues(agent).Inc() }

// StallKilled counts one stall kill of agent: the signature of
// supervisor.Config.StallKilled.
func (m *Metrics) StallKilled(agent string) { m.StallKills.WithLabelValues(agent).Inc() }

// Gatherer is the registry, for tests and linting.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.registry }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// processCollector reports vigil_processes{kind,status} from the store.
type processCollector struct {
	store  store.Store
	clock  clock.Clock
	logger *slog.Logger
}

var processesDesc = prometheus.NewDesc("vigil_processes",
	"Process instances by kind and computed status (alive, stopped).", []string{"kind", "status"}, nil)

func (c *processCollector) Describe(ch chan<- *prometheus.Desc) { ch <- processesDesc }

func (c *processCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	counts, err := c.store.ProcessCounts(ctx, c.clock.Now())
	if err != nil {
		c.logger.Error("metrics: count processes", "err", err)
		ch <- prometheus.NewInvalidMetric(processesDesc, err)
		return
	}
	for _, pc := range counts {
		ch <- prometheus.MustNewConstMetric(processesDesc, prometheus.GaugeValue, float64(pc.Count), pc.Kind, string(pc.Status))
	}
}
