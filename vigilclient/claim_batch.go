package vigilclient

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// ClaimBatchMax is the most tasks one ClaimBatch may ask for (the server's
// bound on max_tasks).
const ClaimBatchMax = 100

// ClaimBatch atomically takes up to maxTasks claimable tasks of taskTypes for
// inst in one request (max_tasks, issue #6), in the order single claims
// would take them. Each returned task is running under its own lease, at
// its own lease_epoch: use inst.Lease(task) for every later call on each,
// exactly as for a task from Claim. An empty slice when nothing is
// claimable. Errors as Claim, and ErrInvalid for maxTasks outside
// 1–ClaimBatchMax (refused by the server; nothing is claimed).
func (c *Client) ClaimBatch(ctx context.Context, inst Instance, taskTypes []string, maxTasks int) ([]*vigiltype.Task, error) {
	body := map[string]any{"instance_id": inst.ID, "task_types": taskTypes, "max_tasks": maxTasks}
	var out struct {
		Tasks []*vigiltype.Task `json:"tasks"`
	}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/tasks/claim", instance: inst.Token, body: body}, &out); err != nil {
		return nil, fmt.Errorf("claim up to %d of %v for instance %s: %w", maxTasks, taskTypes, inst.ID, err)
	}
	if out.Tasks == nil {
		out.Tasks = []*vigiltype.Task{}
	}
	return out.Tasks, nil
}

// pollLoopBatch is pollLoop for an agent with Concurrency > 1: it claims up
// to its free slots at a time and runs each task with runTask in a
// goroutine of its own, so each keeps its own lease, heartbeats and
// outcome. It claims again at once when a task finishes or a batch came
// back full, and after PollInterval when a batch came back short (the
// queue is empty) or the claim failed. Once stop ends it claims no more
// and returns when every running task is finished or released.
func (r *runner) pollLoopBatch(stop context.Context) {
	if len(r.types) == 0 {
		<-stop.Done()
		return
	}
	// Tasks that finish together are completed in one request (see
	// completer); it stops once every task is done.
	cp := newCompleter(r.client, r.slots)
	defer cp.close()
	var tasks sync.WaitGroup
	defer tasks.Wait() // each running task drains on its own (runTask)
	finished := make(chan struct{}, r.slots)
	running := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-stop.Done():
			return
		case <-timer.C:
		case <-finished:
			running--
		}
		if stop.Err() != nil {
			return // both were ready and select chose another case: claim nothing more
		}
		for more := true; more; {
			select {
			case <-finished:
				running--
			default:
				more = false
			}
		}
		if running >= r.slots {
			continue // a finishing task wakes the loop
		}
		inst, fenceCh, resumeCh, fenced := r.state()
		if fenced {
			select {
			case <-stop.Done():
				return
			case <-resumeCh:
			}
			timer.Reset(0)
			continue
		}
		want := min(r.slots-running, ClaimBatchMax)
		// As in pollLoop, the claim is not cancelled by stop; tasks
		// claimed after stop are released at once.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(stop), callTimeoutMax)
		sent := time.Now()
		batch, err := r.client.ClaimBatch(cctx, inst, r.types, want)
		cancel()
		switch {
		case err != nil:
			if instanceGone(err) {
				r.fenceAndLog(fmt.Errorf("%w: the server no longer accepts instance %s: %w", ErrFenced, inst.ID, err))
			} else if stop.Err() == nil {
				r.log.Warn("claim failed", "instance_id", inst, "err", err, "max_tasks", want)
			}
			timer.Reset(r.set.PollInterval)
		case stop.Err() != nil:
			for _, task := range batch {
				r.release(stop, r.taskLog(inst, task), inst.Lease(task))
			}
			return
		default:
			for _, task := range batch {
				running++
				tasks.Go(func() {
					r.runTask(stop, inst, fenceCh, task, sent, cp.complete)
					finished <- struct{}{}
				})
			}
			if len(batch) < want {
				timer.Reset(r.set.PollInterval)
			} else {
				timer.Reset(0)
			}
		}
	}
}
