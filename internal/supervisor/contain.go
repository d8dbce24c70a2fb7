package supervisor

import "time"

// EnvGeneration marks every process of one agent generation (one launch):
// the supervisor sets it in the leader's environment to
// "<supervisor pid>.<random>.<agent>.<attempt>", and descendants inherit it
// through fork, exec and setsid. On Linux the supervisor finds the
// generation's processes by this marker in /proc/<pid>/environ, so that a
// descendant that left the process group is stopped with it (DESIGN S3).
// A descendant that clears its environment before escaping the group is not
// found (see doc.go).
const EnvGeneration = "VIGIL_GENERATION"

// reapIntervalDefault is how often the reaper scans for adopted orphans
// besides on SIGCHLD.
const reapIntervalDefault = time.Second
