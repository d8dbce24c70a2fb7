package vigilclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// CompleteBatchMax is the most tasks one CompleteBatch may carry (the
// server's bound on items).
const CompleteBatchMax = 100

// CompleteItem is one task of a CompleteBatch: the lease it is held under
// and its result, marshalled with encoding/json as Complete marshals one.
type CompleteItem struct {
	Lease  Lease
	Result any
}

// CompleteResult answers one CompleteItem: the completed task, or Err, the
// error Complete would have returned for that task alone (ErrStaleEpoch:
// the lease is no longer held; ErrOutcomeConflict: the lease already
// completed it with another result; ErrNotFound). An item that repeats the
// complete its lease ended with gets the stored task.
type CompleteResult struct {
	Task *vigiltype.Task
	Err  error
}

// CompleteBatch completes several tasks held by inst in one request
// (POST /v1/tasks/complete) and one server transaction. Each item is
// checked as a single Complete and gets its own result, in items' order:
// a stale item fails alone. The error is for the request as a whole (the
// server unreachable, a 5xx, a malformed batch, an invalid instance token);
// then nothing was completed.
func (c *Client) CompleteBatch(ctx context.Context, inst Instance, items []CompleteItem) ([]CompleteResult, error) {
	type wireItem struct {
		TaskID     int64 `json:"task_id"`
		LeaseEpoch int64 `json:"lease_epoch"`
		Result     any   `json:"result"`
	}
	body := struct {
		InstanceID string     `json:"instance_id"`
		Items      []wireItem `json:"items"`
	}{InstanceID: inst.ID, Items: make([]wireItem, len(items))}
	for i, it := range items {
		body.Items[i] = wireItem{TaskID: it.Lease.TaskID, LeaseEpoch: it.Lease.Epoch, Result: it.Result}
	}
	var out struct {
		Results []struct {
			TaskID int64           `json:"task_id"`
			Task   *vigiltype.Task `json:"task"`
			Error  *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		} `json:"results"`
	}
	req := request{method: http.MethodPost, path: "/v1/tasks/complete", instance: inst.Token, body: body}
	if _, err := c.do(ctx, req, &out); err != nil {
		return nil, fmt.Errorf("complete %d tasks for instance %s: %w", len(items), inst.ID, err)
	}
	if len(out.Results) != len(items) {
		return nil, fmt.Errorf("complete %d tasks for instance %s: the server answered %d results", len(items), inst.ID, len(out.Results))
	}
	results := make([]CompleteResult, len(items))
	for i, r := range out.Results {
		l := items[i].Lease
		switch {
		case r.Error != nil:
			ae := &APIError{Status: itemStatus(r.Error.Code), Code: r.Error.Code, Message: r.Error.Message}
			results[i].Err = fmt.Errorf("complete task %d at epoch %d: %w", l.TaskID, l.Epoch, ae)
		case r.Task == nil || r.TaskID != l.TaskID:
			results[i].Err = fmt.Errorf("complete task %d at epoch %d: the server answered for task %d without a task", l.TaskID, l.Epoch, r.TaskID)
		default:
			results[i].Task = r.Task
		}
	}
	return results, nil
}

// itemStatus is the HTTP status a single complete answers with an item's
// error code, so that an item's APIError reads as that call's would.
func itemStatus(code string) int {
	switch code {
	case CodeStaleEpoch, CodeOutcomeConflict:
		return http.StatusConflict
	case CodeNotFound:
		return http.StatusNotFound
	case CodeInvalid, CodeMalformedJSON:
		return http.StatusBadRequest
	}
	return http.StatusConflict // refused, and not worth sending again
}

// Batching of an agent's completions (Concurrency > 1).
const (
	// completeWindow is how long the first finished task of a batch waits
	// for others before the batch is sent.
	completeWindow = 2 * time.Millisecond
)

// completeReq is one finished task waiting for its batch.
type completeReq struct {
	lease  Lease
	result json.RawMessage
	done   chan error // buffered: the batcher never blocks on a caller gone
}

// completer sends the completions of one agent's tasks in batches: a task's
// completion waits up to completeWindow for others (or until max are
// ready) and they go out in one CompleteBatch. Each caller gets its own
// task's error, so its retries, logging and lease-lost handling stay its
// own. Calls made while a batch is in flight join the next one.
type completer struct {
	client *Client
	max    int
	reqs   chan completeReq
	wg     sync.WaitGroup

	mu          sync.Mutex
	unsupported bool // the server has no batch call: complete one by one
}

func newCompleter(client *Client, maxBatch int) *completer {
	c := &completer{client: client, max: max(1, min(maxBatch, CompleteBatchMax)), reqs: make(chan completeReq)}
	c.wg.Go(c.loop)
	return c
}

// close stops the batcher once no more calls will come.
func (c *completer) close() {
	close(c.reqs)
	c.wg.Wait()
}

// complete completes the task held under lease with result, in a batch
// with others finishing at about the same time; its error is this task's
// alone, as Client.Complete's would be.
func (c *completer) complete(ctx context.Context, lease Lease, result json.RawMessage) error {
	req := completeReq{lease: lease, result: result, done: make(chan error, 1)}
	select {
	case c.reqs <- req:
	case <-ctx.Done():
		return fmt.Errorf("complete task %d at epoch %d: %w", lease.TaskID, lease.Epoch, context.Cause(ctx))
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("complete task %d at epoch %d: %w", lease.TaskID, lease.Epoch, context.Cause(ctx))
	}
}

func (c *completer) loop() {
	window := time.NewTimer(0)
	<-window.C
	defer window.Stop()
	for {
		first, ok := <-c.reqs
		if !ok {
			return
		}
		batch := []completeReq{first}
		window.Reset(completeWindow)
	collect:
		for len(batch) < c.max {
			select {
			case r, ok := <-c.reqs:
				if !ok {
					break collect
				}
				batch = append(batch, r)
			case <-window.C:
				break collect
			}
		}
		if !window.Stop() {
			select {
			case <-window.C:
			default:
			}
		}
		c.send(batch)
	}
}

// send completes batch in one request, or one by one when it holds a
// single task or the server has no batch call.
func (c *completer) send(batch []completeReq) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeoutMax)
	defer cancel()
	c.mu.Lock()
	single := c.unsupported
	c.mu.Unlock()
	if len(batch) == 1 || single {
		for _, r := range batch {
			_, err := c.client.Complete(ctx, r.lease, r.result)
			r.done <- err
		}
		return
	}
	// One request per instance: a runner that resumed under a new
	// instance may still be finishing tasks claimed under the old one.
	var rest []completeReq
	for _, r := range batch[1:] {
		if r.lease.Instance != batch[0].lease.Instance {
			rest = append(rest, r)
		}
	}
	if len(rest) > 0 {
		defer c.send(rest)
		first := batch[0].lease.Instance
		batch = slices.DeleteFunc(batch, func(r completeReq) bool { return r.lease.Instance != first })
	}
	items := make([]CompleteItem, len(batch))
	for i, r := range batch {
		items[i] = CompleteItem{Lease: r.lease, Result: r.result}
	}
	results, err := c.client.CompleteBatch(ctx, batch[0].lease.Instance, items)
	var ae *APIError
	if err != nil && errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusMethodNotAllowed) && ae.Code != CodeNotFound {
		// A server from before batch completes: send them one by one, now
		// and from now on.
		c.mu.Lock()
		c.unsupported = true
		c.mu.Unlock()
		for _, r := range batch {
			_, err := c.client.Complete(ctx, r.lease, r.result)
			r.done <- err
		}
		return
	}
	for i, r := range batch {
		if err != nil {
			r.done <- fmt.Errorf("complete task %d at epoch %d: %w", r.lease.TaskID, r.lease.Epoch, err)
			continue
		}
		r.done <- results[i].Err
	}
}
