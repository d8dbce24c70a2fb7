// Package heartbeat is the activity-gated heartbeat loop for sessions that
// are not written against the Go SDK — a shell script, an interactive coding
// agent, a CI job (DESIGN H1–H5, seed 002).
//
// The loop is the vigil binary re-executed detached (`vigil heartbeat loop`,
// own session, stdio to <workdir>/.vigil/heartbeat.log, cwd = the workdir).
// Every tick it decides, in this order:
//
//  1. Is the captured parent process still the same live process? A
//     missing pid, a zombie, or a pid whose start time differs from the one
//     captured at spawn (pid reuse) is gone: the loop exits cleanly, removes
//     its pid file and lets the lease lapse. EPERM from kill(pid, 0) counts
//     as alive.
//  2. Liveness: when the state dir holds a session instance, send its
//     liveness heartbeat — every tick while the parent lives, whether or not
//     the work is active (liveness is not activity-gated).
//  3. Activity: the mtime of <workdir>/.vigil/last-activity. Missing, older
//     than the staleness bound, or in the future (clock stepped back, a bad
//     touch): skip the lease heartbeat this tick. Else send a schema_version
//     2 lease heartbeat with activity_at = the mtime.
//
// A lease heartbeat refused because the lease is gone (409 stale_epoch,
// 404, a wrong token, an exited instance) ends the loop. Writes that keep
// failing for longer than the lease window end it with an error (non-zero
// exit), instead of looping silently.
//
// State directory layout, <workdir>/.vigil/ (mode 0700):
//
//	heartbeat.pid         "PID STARTTIME" of the loop process
//	heartbeat.parent.pid  "PID STARTTIME" of the process whose life bounds the loop
//	instance.json         session instance id and token (0600)
//	task.json             task id, type and lease epoch of the held task
//	last-activity         empty file; its mtime is the last activity
//	heartbeat.log         the loop's log
//
// STARTTIME is field 22 of /proc/PID/stat (clock ticks since boot) on Linux,
// 0 (unknown, not compared) elsewhere.
//
// The watchdog (Scan, Judge) finds loops by scanning /proc for processes
// whose command line is `… heartbeat loop …`, not by pid files: the pid
// file of a loop whose workdir was deleted is deleted with it. A workdir is
// gone when the loop's cwd (which is the workdir) has link count 0.
package heartbeat
