//go:build unix

package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockFleet takes the lock of `vigil up` on an SQLite store (flock on
// DB.up.lock, held until the returned func runs or the process ends): two
// `vigil up` on one database would run every agent twice. The holder's pid
// is written in the file for the error the next one gets.
func lockFleet(db string) (func(), error) {
	path := db + ".up.lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := "another vigil up"
			if pid := strings.TrimSpace(string(holder)); pid != "" {
				who += " (pid " + pid + ")"
			}
			return nil, fmt.Errorf("%s already supervises the fleet on %s: a second one would run every agent twice; stop it, or give this one its own --db (lock %s)", who, db, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { _ = f.Close() }, nil // closing releases the flock
}
