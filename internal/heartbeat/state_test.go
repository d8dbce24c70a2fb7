package heartbeat

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// FuzzStateFiles drives the readers of a session's state directory,
// <workdir>/.vigil/, with arbitrary file contents: the pid files
// (ReadProcRef, Status, removeIfOwned), instance.json (ReadInstance),
// task.json (ReadTask) and the last-activity file's mtime (State.Activity,
// then the loop's Activity decision). Invariants: no panic; an error names
// the file it is about; what a reader accepts is what its writer writes
// back (a round trip through WriteProcRef, WriteInstance, WriteTask);
// Activity sends a heartbeat for the mtime read only when it is neither
// stale nor in the future.
func FuzzStateFiles(f *testing.F) {
	f.Add([]byte("4242 192933\n"), []byte(`{
  "instance_id": "01JDZ6Q3N9V8K5T2R7M4W1X0YB",
  "instance_token": "vt_4f3c2b1a",
  "process_kind": "session",
  "hostname": "box1",
  "owner_pid": 4242,
  "owner_start_time": 192933,
  "liveness_interval_s": 30
}
`), []byte(`{
  "task_id": 7,
  "task_type": "sleep",
  "lease_epoch": 1,
  "instance_id": "01JDZ6Q3N9V8K5T2R7M4W1X0YB",
  "claimed_at": "2026-11-30T12:00:00.123Z"
}
`), int64(1796040000), int64(123_000_000))
	f.Add([]byte("4242"), []byte(`{"instance_id":"a","instance_token":"b"}`), []byte(`{"task_id":1,"lease_epoch":1,"claimed_at":"2026-11-30T13:00:00+01:00"}`), int64(0), int64(0))
	f.Add([]byte("1 2 3"), []byte(`{"instance_id":"","instance_token":"b"}`), []byte(`{"task_id":0,"lease_epoch":1}`), int64(-1), int64(-1))
	f.Add([]byte("-5 x"), []byte("null"), []byte(`{"task_id":1,"lease_epoch":1,"claimed_at":"not a time"}`), int64(1<<40), int64(0))
	f.Add([]byte(" \n"), []byte(`{"instance_id":"a","instance_token":"b","owner_pid":1e99}`), []byte(`[]`), int64(253402300800), int64(0))
	f.Add([]byte("99999999999999999999 18446744073709551616"), []byte(""), []byte("{"), int64(-62135596800), int64(0))

	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, pidFile, instance, task []byte, mtimeS, mtimeNS int64) {
		st, err := Open(t.TempDir())
		require.NoError(t, err)
		require.NoError(t, st.Init())
		write := func(name string, b []byte) {
			require.NoError(t, os.WriteFile(st.Path(name), b, 0o600))
		}
		write(PIDFile, pidFile)
		write(ParentPIDFile, pidFile)
		write(InstanceFile, instance)
		write(TaskFile, task)
		write(ActivityFile, nil)

		ref, err := st.ReadProcRef(PIDFile)
		if err != nil {
			require.ErrorContains(t, err, st.Path(PIDFile))
			_, err := st.Status()
			require.ErrorContains(t, err, st.Path(PIDFile))
		} else {
			require.Positive(t, ref.PID)
			require.NoError(t, st.WriteProcRef("copy.pid", ref))
			again, err := st.ReadProcRef("copy.pid")
			require.NoError(t, err)
			require.Equal(t, ref, again)
			_, err = st.Status()
			require.NoError(t, err)
			require.NoError(t, removeIfOwned(st.Path(PIDFile), ref.PID))
			_, err = os.Stat(st.Path(PIDFile))
			require.ErrorIs(t, err, os.ErrNotExist, "the pid file of %d is removed", ref.PID)
		}

		is, err := st.ReadInstance()
		if err != nil {
			require.ErrorContains(t, err, st.Path(InstanceFile))
		} else {
			require.NotEmpty(t, is.InstanceID)
			require.NotEmpty(t, is.InstanceToken)
			require.NoError(t, st.WriteInstance(is))
			again, err := st.ReadInstance()
			require.NoError(t, err)
			require.Equal(t, is, again)
		}

		ts, err := st.ReadTask()
		if err != nil {
			require.ErrorContains(t, err, st.Path(TaskFile))
		} else {
			require.Positive(t, ts.TaskID)
			require.Positive(t, ts.LeaseEpoch)
			require.NoError(t, st.WriteTask(ts))
			again, err := st.ReadTask()
			require.NoError(t, err)
			require.True(t, ts.ClaimedAt.Equal(again.ClaimedAt), "claimed_at %v read back as %v", ts.ClaimedAt, again.ClaimedAt)
			ts.ClaimedAt, again.ClaimedAt = time.Time{}, time.Time{}
			require.Equal(t, ts, again)
		}

		set := time.Unix(mtimeS, mtimeNS)
		if err := os.Chtimes(st.Path(ActivityFile), set, set); err != nil {
			return // a time the file system cannot hold
		}
		mtime, ok, err := st.Activity()
		require.NoError(t, err)
		require.True(t, ok)
		const staleness, tolerance = 10 * time.Minute, 5 * time.Second
		switch Activity(now, mtime, ok, staleness, tolerance) {
		case "":
			require.False(t, mtime.After(now.Add(tolerance)), "mtime %v is in the future", mtime)
			require.False(t, mtime.Before(now.Add(-staleness)), "mtime %v is stale", mtime)
		case ActionSkipFuture:
			require.True(t, mtime.After(now.Add(tolerance)), "mtime %v is not in the future", mtime)
		case ActionSkipStale:
			require.True(t, mtime.Before(now.Add(-staleness)), "mtime %v is not stale", mtime)
		default:
			t.Fatalf("Activity(%v) = %q", mtime, Activity(now, mtime, ok, staleness, tolerance))
		}
	})
}
