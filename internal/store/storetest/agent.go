package storetest

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/internal/store"
	"github.com/vigil-fleet/vigil/vigiltype"
)

// exerciseAgent covers the agents table: the registry with its
// unconditional register, oldest-first listing, partial compare-and-swap
// updates and declared status (DESIGN R1).
func exerciseAgent(ctx context.Context, t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("RegisterAndGet", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// Times are kept to the millisecond.
		agent, err := b.s.AgentRegister(ctx, store.AgentRegisterParams{
			Name: "research", Function: "research assistant", TickCron: "0 * * * *",
			Config: json.RawMessage(`{"model": "m1", "tools": ["search"]}`), Now: t0.Add(1500 * time.Microsecond),
		})
		require.NoError(t, err)
		want := &vigiltype.Agent{
			Name: "research", Function: "research assistant", TickCron: "0 * * * *",
			Config: json.RawMessage(`{"model": "m1", "tools": ["search"]}`), Status: vigiltype.AgentActive,
			CreatedAt: at(time.Millisecond), UpdatedAt: at(time.Millisecond), Version: 1,
		}
		requireAgentEqual(t, want, agent)
		requireAgentEqual(t, want, b.getAgent(t, "research"))

		_, err = b.s.AgentGet(ctx, "no-such-agent")
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		require.ErrorContains(t, err, `agent "no-such-agent"`)
	})

	t.Run("RegisterReplaces", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		b.registerAgent(t, store.AgentRegisterParams{
			Name: "research", TickCron: "0 * * * *", Config: json.RawMessage(`{"v": 1}`),
		})
		updated, err := b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: 1, Function: ptr("edited"), Now: at(time.Minute),
		})
		require.NoError(t, err)
		stopped := b.setAgentStatus(t, "research", vigiltype.AgentStopped, at(2*time.Minute))
		require.Equal(t, updated.Version+1, stopped.Version)

		// A second register is not refused: it replaces the whole record —
		// created_at, status and config reset — and moves the version on.
		again := b.registerAgent(t, store.AgentRegisterParams{
			Name: "research", Function: "second", Now: at(time.Hour),
		})
		requireAgentEqual(t, &vigiltype.Agent{
			Name: "research", Function: "second", Status: vigiltype.AgentActive,
			CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour), Version: stopped.Version + 1,
		}, again)
		requireAgentEqual(t, again, b.getAgent(t, "research"))

		agents, err := b.s.AgentList(ctx)
		require.NoError(t, err)
		require.Len(t, agents, 1)
	})

	t.Run("ListOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		agents, err := b.s.AgentList(ctx)
		require.NoError(t, err)
		require.Empty(t, agents)

		b.registerAgent(t, store.AgentRegisterParams{Name: "late", Now: at(2 * time.Second)})
		b.registerAgent(t, store.AgentRegisterParams{Name: "b", Now: at(time.Second)})
		b.registerAgent(t, store.AgentRegisterParams{Name: "a", Now: at(time.Second)})
		b.registerAgent(t, store.AgentRegisterParams{Name: "B", Now: at(time.Second)})
		b.registerAgent(t, store.AgentRegisterParams{Name: "first", Now: t0})
		b.setAgentStatus(t, "first", vigiltype.AgentStopped, at(time.Hour))
		// An update keeps created_at, so the record keeps its place.
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{Name: "b", Version: 1, TickCron: ptr("* * * * *"), Now: at(time.Hour)})
		require.NoError(t, err)

		// Stopped records included; ties on created_at by name, byte by byte.
		require.Equal(t, []string{"first", "B", "a", "b", "late"}, b.agentNames(t))

		// Registering again makes a record new: it moves to the end.
		b.registerAgent(t, store.AgentRegisterParams{Name: "first", Now: at(3 * time.Second)})
		require.Equal(t, []string{"B", "a", "b", "late", "first"}, b.agentNames(t))
	})

	t.Run("UpdatePartial", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		cur := b.registerAgent(t, store.AgentRegisterParams{
			Name: "research", Function: "f0", TickCron: "0 * * * *", Config: json.RawMessage(`{"v": 0}`),
		})
		for i, tt := range []struct {
			name   string
			params store.AgentUpdateParams
			change func(a *vigiltype.Agent)
		}{
			{"Function", store.AgentUpdateParams{Function: ptr("f1")}, func(a *vigiltype.Agent) { a.Function = "f1" }},
			{"TickCron", store.AgentUpdateParams{TickCron: ptr("*/30 * * * *")}, func(a *vigiltype.Agent) { a.TickCron = "*/30 * * * *" }},
			{"TickCronCleared", store.AgentUpdateParams{TickCron: ptr("")}, func(a *vigiltype.Agent) { a.TickCron = "" }},
			{"Config", store.AgentUpdateParams{Config: json.RawMessage(`[1, 2]`)}, func(a *vigiltype.Agent) { a.Config = json.RawMessage(`[1, 2]`) }},
			{"ConfigJSONNull", store.AgentUpdateParams{Config: json.RawMessage(`null`)}, func(a *vigiltype.Agent) { a.Config = json.RawMessage(`null`) }},
			{"Nothing", store.AgentUpdateParams{}, func(*vigiltype.Agent) {}},
			{
				"All",
				store.AgentUpdateParams{Function: ptr("f2"), TickCron: ptr("5 4 * * *"), Config: json.RawMessage(`{"v": 2}`)},
				func(a *vigiltype.Agent) {
					a.Function, a.TickCron, a.Config = "f2", "5 4 * * *", json.RawMessage(`{"v": 2}`)
				},
			},
		} {
			// Every update, even one that changes no field, is a write: the
			// version and updated_at move on; nothing else does.
			now := at(time.Duration(i+1) * time.Minute)
			p := tt.params
			p.Name, p.Version, p.Now = "research", cur.Version, now
			got, err := b.s.AgentUpdate(ctx, p)
			require.NoError(t, err, tt.name)
			want := *cur
			tt.change(&want)
			want.Version = cur.Version + 1
			want.UpdatedAt = now
			requireAgentEqual(t, &want, got)
			requireAgentEqual(t, &want, b.getAgent(t, "research"))
			cur = got
		}
		require.Equal(t, t0, cur.CreatedAt)
		require.Equal(t, vigiltype.AgentActive, cur.Status)

		// An update leaves a stopped record stopped.
		stopped := b.setAgentStatus(t, "research", vigiltype.AgentStopped, at(time.Hour))
		got, err := b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: stopped.Version, Function: ptr("f3"), Now: at(2 * time.Hour),
		})
		require.NoError(t, err)
		require.Equal(t, vigiltype.AgentStopped, got.Status)
		require.Equal(t, ptr(at(time.Hour)), got.StoppedAt)
	})

	// Who wrote a record's config (launch commands are operator data,
	// issue #13): a register stores its writer's role, an update that
	// changes the config stores its own, one that does not keeps the
	// stored one; a status change keeps it too.
	t.Run("ConfigWrittenBy", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		a := b.registerAgent(t, store.AgentRegisterParams{
			Name: "research", Config: json.RawMessage(`{"launch": {"host": "h", "command": ["x"]}}`), ConfigWrittenBy: "operator",
		})
		require.Equal(t, "operator", a.ConfigWrittenBy)
		require.Equal(t, "operator", b.getAgent(t, "research").ConfigWrittenBy)
		listed, err := b.s.AgentList(ctx)
		require.NoError(t, err)
		require.Equal(t, "operator", listed[0].ConfigWrittenBy)

		a, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: a.Version, Function: ptr("f1"), ConfigWrittenBy: "agent", Now: at(time.Minute),
		})
		require.NoError(t, err)
		require.Equal(t, "operator", a.ConfigWrittenBy, "an update without a config keeps who wrote the config")
		a, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: a.Version, Config: json.RawMessage(`{"v": 1}`), ConfigWrittenBy: "agent", Now: at(2 * time.Minute),
		})
		require.NoError(t, err)
		require.Equal(t, "agent", a.ConfigWrittenBy)
		require.Equal(t, "agent", b.setAgentStatus(t, "research", vigiltype.AgentStopped, at(3*time.Minute)).ConfigWrittenBy)

		a = b.registerAgent(t, store.AgentRegisterParams{Name: "research", Now: at(time.Hour)})
		require.Empty(t, a.ConfigWrittenBy, "a register replaces it: unknown")
		require.Empty(t, b.getAgent(t, "research").ConfigWrittenBy)
	})

	t.Run("UpdateCompareAndSwap", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		read := b.registerAgent(t, store.AgentRegisterParams{Name: "research", Function: "f0", TickCron: "0 * * * *"})

		// Two updaters read version 1; the first to write wins.
		won, err := b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: read.Version, Function: ptr("from-a"), Now: at(time.Minute),
		})
		require.NoError(t, err)
		require.Equal(t, read.Version+1, won.Version)
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: read.Version, Function: ptr("from-b"), TickCron: ptr("* * * * *"),
			Config: json.RawMessage(`{"b": true}`), Now: at(2 * time.Minute),
		})
		require.ErrorIs(t, err, vigiltype.ErrConflict)
		require.ErrorContains(t, err, `agent "research"`)
		// The loser wrote nothing, not even the fields the winner left alone.
		requireAgentEqual(t, won, b.getAgent(t, "research"))

		// A register between read and update moves the version on too.
		read = b.getAgent(t, "research")
		b.registerAgent(t, store.AgentRegisterParams{Name: "research", Function: "re-registered", Now: at(time.Hour)})
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: read.Version, Function: ptr("stale"), Now: at(2 * time.Hour),
		})
		require.ErrorIs(t, err, vigiltype.ErrConflict)
		require.Equal(t, "re-registered", b.getAgent(t, "research").Function)

		// So does a status change.
		read = b.getAgent(t, "research")
		b.setAgentStatus(t, "research", vigiltype.AgentStopped, at(3*time.Hour))
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: read.Version, Function: ptr("stale"), Now: at(4 * time.Hour),
		})
		require.ErrorIs(t, err, vigiltype.ErrConflict)

		// A version from the future conflicts as well; a missing record is
		// not found, not a conflict.
		read = b.getAgent(t, "research")
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{Name: "research", Version: read.Version + 1, Now: at(5 * time.Hour)})
		require.ErrorIs(t, err, vigiltype.ErrConflict)
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{Name: "nobody", Version: 1, Function: ptr("x"), Now: t0})
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		require.NotErrorIs(t, err, vigiltype.ErrConflict)
		require.ErrorContains(t, err, `agent "nobody"`)
		_, err = b.s.AgentGet(ctx, "nobody")
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		requireAgentEqual(t, read, b.getAgent(t, "research"))
	})

	t.Run("UpdateCompareAndSwapConcurrent", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		read := b.registerAgent(t, store.AgentRegisterParams{Name: "research"})
		const updaters = 8
		results := make([]*vigiltype.Agent, updaters)
		errs := make([]error, updaters)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range updaters {
			wg.Go(func() {
				<-start
				results[i], errs[i] = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
					Name: "research", Version: read.Version, Function: ptr(string(rune('a' + i))), Now: at(time.Minute),
				})
			})
		}
		close(start)
		wg.Wait()

		// Exactly one updater wins; every other one gets ErrConflict.
		var winner *vigiltype.Agent
		for i, err := range errs {
			if err == nil {
				require.Nil(t, winner, "two updaters won from one version")
				winner = results[i]
				continue
			}
			require.ErrorIs(t, err, vigiltype.ErrConflict)
		}
		require.NotNil(t, winner)
		require.Equal(t, read.Version+1, winner.Version)
		requireAgentEqual(t, winner, b.getAgent(t, "research"))
	})

	t.Run("SetStatus", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		cur := b.registerAgent(t, store.AgentRegisterParams{Name: "research", Config: json.RawMessage(`{"k": "v"}`)})

		stopped := b.setAgentStatus(t, "research", vigiltype.AgentStopped, at(time.Minute+1500*time.Microsecond))
		want := *cur
		want.Status = vigiltype.AgentStopped
		want.StoppedAt = ptr(at(time.Minute + time.Millisecond))
		want.UpdatedAt = at(time.Minute + time.Millisecond)
		want.Version = cur.Version + 1
		requireAgentEqual(t, &want, stopped)
		requireAgentEqual(t, &want, b.getAgent(t, "research"))

		active := b.setAgentStatus(t, "research", vigiltype.AgentActive, at(time.Hour))
		want.Status = vigiltype.AgentActive
		want.StoppedAt = nil
		want.UpdatedAt = at(time.Hour)
		want.Version++
		requireAgentEqual(t, &want, active)
		requireAgentEqual(t, &want, b.getAgent(t, "research"))

		// Marking it active again is a write like any other.
		again := b.setAgentStatus(t, "research", vigiltype.AgentActive, at(2*time.Hour))
		require.Equal(t, want.Version+1, again.Version)
		require.Nil(t, again.StoppedAt)

		_, err := b.s.AgentSetStatus(ctx, "nobody", vigiltype.AgentStopped, t0)
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		_, err = b.s.AgentSetStatus(ctx, "research", "paused", at(3*time.Hour))
		require.ErrorIs(t, err, vigiltype.ErrInvalid)
		requireAgentEqual(t, again, b.getAgent(t, "research"))
	})

	t.Run("ConfigIsOpaqueJSON", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		// nil is no config (SQL NULL); the JSON literal null is kept as
		// null, apart from nil.
		for i, config := range []json.RawMessage{
			nil,
			json.RawMessage(`null`),
			json.RawMessage(`{}`),
			json.RawMessage(`{"prompt": "Be brief.\nCite \"sources\".", "tools": [{"name": "search", "args": null}], "n": 1.5, "ok": true, "ü": "ß"}`),
			json.RawMessage(`[]`),
			json.RawMessage(`[1, "two", {"three": [3]}, null]`),
			json.RawMessage(`"just a string"`),
			json.RawMessage(`42`),
		} {
			name := "agent-" + string(rune('a'+i))
			got := b.registerAgent(t, store.AgentRegisterParams{Name: name, Config: config})
			requireJSONEq(t, config, got.Config, name)
			requireJSONEq(t, config, b.getAgent(t, name).Config, name)

			// An update sets the same documents.
			if config == nil {
				continue
			}
			other := b.registerAgent(t, store.AgentRegisterParams{Name: "updated-" + name, Config: json.RawMessage(`{"old": 1}`)})
			got, err := b.s.AgentUpdate(ctx, store.AgentUpdateParams{Name: other.Name, Version: other.Version, Config: config, Now: at(time.Minute)})
			require.NoError(t, err)
			requireJSONEq(t, config, got.Config, other.Name)
			requireJSONEq(t, config, b.getAgent(t, other.Name).Config, other.Name)
		}
	})

	t.Run("InvalidConfigWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(ctx, t, newStore)

		for _, bad := range []json.RawMessage{json.RawMessage(`{"model":`), json.RawMessage(``), json.RawMessage(`{'a': 1}`)} {
			_, err := b.s.AgentRegister(ctx, store.AgentRegisterParams{Name: "research", Function: "f", Config: bad, Now: t0})
			require.ErrorIs(t, err, vigiltype.ErrInvalid, "%q", bad)
		}
		_, err := b.s.AgentGet(ctx, "research")
		require.ErrorIs(t, err, vigiltype.ErrNotFound)
		agents, err := b.s.AgentList(ctx)
		require.NoError(t, err)
		require.Empty(t, agents)

		cur := b.registerAgent(t, store.AgentRegisterParams{Name: "research", Config: json.RawMessage(`{"v": 1}`)})
		_, err = b.s.AgentRegister(ctx, store.AgentRegisterParams{Name: "research", Function: "f", Config: json.RawMessage(`[`), Now: at(time.Minute)})
		require.ErrorIs(t, err, vigiltype.ErrInvalid)
		_, err = b.s.AgentUpdate(ctx, store.AgentUpdateParams{
			Name: "research", Version: cur.Version, Function: ptr("changed"), Config: json.RawMessage(`{"v": }`), Now: at(time.Minute),
		})
		require.ErrorIs(t, err, vigiltype.ErrInvalid)
		requireAgentEqual(t, cur, b.getAgent(t, "research"))
	})
}

// registerAgent registers an agent, filling unset fields: function
// "worker" and Now = t0.
func (b *testBundle) registerAgent(t *testing.T, p store.AgentRegisterParams) *vigiltype.Agent {
	t.Helper()
	p.Function = cmp.Or(p.Function, "worker")
	p.Now = cmp.Or(p.Now, t0)
	agent, err := b.s.AgentRegister(b.ctx, p)
	require.NoError(t, err)
	return agent
}

// getAgent returns an agent's record.
func (b *testBundle) getAgent(t *testing.T, name string) *vigiltype.Agent {
	t.Helper()
	agent, err := b.s.AgentGet(b.ctx, name)
	require.NoError(t, err)
	return agent
}

// setAgentStatus marks an agent stopped or active at now.
func (b *testBundle) setAgentStatus(t *testing.T, name string, status vigiltype.AgentStatus, now time.Time) *vigiltype.Agent {
	t.Helper()
	agent, err := b.s.AgentSetStatus(b.ctx, name, status, now)
	require.NoError(t, err)
	return agent
}

// agentNames lists the registry and returns the names in listing order.
func (b *testBundle) agentNames(t *testing.T) []string {
	t.Helper()
	agents, err := b.s.AgentList(b.ctx)
	require.NoError(t, err)
	var names []string
	for _, a := range agents {
		names = append(names, a.Name)
	}
	return names
}

// requireAgentEqual compares two agent records, the config by meaning (a
// backend may store JSON normalised) and the rest exactly.
func requireAgentEqual(t *testing.T, want, got *vigiltype.Agent) {
	t.Helper()
	require.NotNil(t, got)
	requireJSONEq(t, want.Config, got.Config, "config")
	w, g := *want, *got
	w.Config, g.Config = nil, nil
	require.Equal(t, w, g)
}
