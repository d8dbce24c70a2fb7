package vigilclient

import (
	"context"
	"fmt"
	"net/http"

	"github.com/vigil-fleet/vigil/vigiltype"
)

// Snapshot reads the fleet snapshot (GET /v1/snapshot).
func (c *Client) Snapshot(ctx context.Context) (*vigiltype.FleetSnapshot, error) {
	var out vigiltype.FleetSnapshot
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/snapshot"}, &out); err != nil {
		return nil, fmt.Errorf("fleet snapshot: %w", err)
	}
	return &out, nil
}
