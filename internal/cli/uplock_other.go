//go:build !unix

package cli

// lockFleet is a no-op off unix (no flock): run one `vigil up` per database.
func lockFleet(string) (func(), error) { return func() {}, nil }
