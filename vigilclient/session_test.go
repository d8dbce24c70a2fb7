package vigilclient_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vigil-fleet/vigil/vigilclient"
	"github.com/vigil-fleet/vigil/vigiltype"
)

func TestClientSessionCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.client

	reg, err := c.RegisterProcess(ctx, vigilclient.RegisterParams{ProcessKind: "session", Hostname: "box1", PID: 42, LivenessInterval: time.Minute})
	require.NoError(t, err)
	inst := reg.Instance()

	first, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "review"})
	require.NoError(t, err)
	second, err := c.Enqueue(ctx, vigilclient.EnqueueParams{TaskType: "review"})
	require.NoError(t, err)

	// Claim the second by id, skipping the older first.
	got, err := c.ClaimByID(ctx, inst, second.TaskID)
	require.NoError(t, err)
	require.Equal(t, second.TaskID, got.TaskID)
	require.Equal(t, vigiltype.TaskRunning, got.Status)

	_, err = c.ClaimByID(ctx, inst, second.TaskID)
	var ae *vigilclient.APIError
	require.True(t, errors.As(err, &ae), "%v", err)
	require.Equal(t, vigilclient.CodeNotClaimable, ae.Code)
	_, err = c.ClaimByID(ctx, inst, 999)
	require.ErrorIs(t, err, vigiltype.ErrNotFound)

	activity := got.StartedAt.Add(time.Millisecond)
	hb, err := c.TaskHeartbeatV2(ctx, inst.Lease(got), activity)
	require.NoError(t, err)
	require.Equal(t, 2, hb.HeartbeatSchemaVersion)
	require.NotNil(t, hb.LastActivityAt)
	require.True(t, hb.LastActivityAt.Equal(activity.Truncate(time.Millisecond)), "%s", hb.LastActivityAt)

	_, err = c.TaskHeartbeatV2(ctx, inst.Lease(got), time.Now().Add(time.Hour))
	require.ErrorIs(t, err, vigiltype.ErrInvalid, "activity in the future")

	v, err := c.HeartbeatVersions(ctx, time.Hour)
	require.NoError(t, err)
	require.Equal(t, time.Hour, v.Window)
	require.Len(t, v.Hosts, 1)
	require.Equal(t, "box1", v.Hosts[0].Hostname)
	require.Equal(t, 2, v.Hosts[0].SchemaVersion)
	require.EqualValues(t, 1, v.Hosts[0].Heartbeats)

	still, err := c.GetTask(ctx, first.TaskID)
	require.NoError(t, err)
	require.Equal(t, vigiltype.TaskScheduled, still.Status, "ClaimByID takes only the task asked for")
}
