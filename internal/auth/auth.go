// Package auth holds vigil's roles and the token files that grant them
// (docs/security.md, DESIGN §7): operator, agent and read, each role's
// tokens in a file of its own, several a file so that they can rotate.
//
// A Keyring maps a bearer token to its role. It compares SHA-256 digests
// in constant time, over every token it holds, so neither the token nor
// its length shows in the time an answer takes. It re-reads its files when
// they change (checked at most once every CheckEveryDefault, on the
// request that follows), so a token is added or withdrawn without a
// restart; a file that cannot be read or parsed then leaves the tokens as
// they were, and says why in the log.
package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
)

// Role is what a bearer token may do. The roles are ordered: each may do
// what the ones below it may.
type Role string

const (
	// RoleNone is no role at all: a request without a token, or one with a
	// token the server does not hold.
	RoleNone Role = ""
	// RoleRead reads: every GET of /v1, the dashboard's data, /metrics and
	// the MCP tools (all of which only read).
	RoleRead Role = "read"
	// RoleAgent is what an agent process and its SDK need besides reads:
	// register an instance, heartbeat, exit, claim and the lease calls
	// (each also proves the instance token), enqueue, record events.
	RoleAgent Role = "agent"
	// RoleOperator may do everything: registry writes, stops, acks,
	// prune, reclaim.
	RoleOperator Role = "operator"
)

// rank orders the roles; an unknown role ranks with RoleNone.
func (r Role) rank() int {
	switch r {
	case RoleRead:
		return 1
	case RoleAgent:
		return 2
	case RoleOperator:
		return 3
	}
	return 0
}

// Covers reports whether a token of role r may make a call that needs
// role need. Every role covers RoleNone (a public route).
func (r Role) Covers(need Role) bool { return r.rank() >= need.rank() }

// TokenMinLen is the shortest token a token file may hold.
const TokenMinLen = 16

// ParseTokens reads a token file: one token a line, spaces around it
// ignored; blank lines and lines starting with # are skipped. A token is
// at least TokenMinLen characters, printable, with no space inside. The
// file must hold at least one. Errors name the line, never the token.
func ParseTokens(data []byte) ([]string, error) {
	var tokens []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		switch {
		case len(line) < TokenMinLen:
			return nil, fmt.Errorf("line %d: a token must be at least %d characters", n, TokenMinLen)
		case strings.IndexFunc(line, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
			return nil, fmt.Errorf("line %d: a token must be one word of printable characters (one token a line)", n)
		}
		tokens = append(tokens, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		return nil, errors.New("no token in the file (one token a line; blank lines and # comments are skipped)")
	}
	return tokens, nil
}

// ReadClientToken returns the token a client sends from token file path:
// its first token (ParseTokens). During a rotation the new token goes
// first, so clients pick it up when they restart while the server still
// accepts the old one further down.
func ReadClientToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tokens, err := ParseTokens(b)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return tokens[0], nil
}

// Files names the token file of each role; "" for none.
type Files struct {
	Operator string // --token-file
	Agent    string // --agent-token-file
	Read     string // --read-token-file
}

// Empty reports whether no token file is given: the server is then open.
func (f Files) Empty() bool { return f == Files{} }

// each lists the given files with their role and flag.
func (f Files) each() []roleFile {
	var out []roleFile
	for _, rf := range []roleFile{
		{RoleOperator, "--token-file", f.Operator},
		{RoleAgent, "--agent-token-file", f.Agent},
		{RoleRead, "--read-token-file", f.Read},
	} {
		if rf.path != "" {
			out = append(out, rf)
		}
	}
	return out
}

type roleFile struct {
	role Role
	flag string
	path string
}

// CheckEveryDefault is how often, at most, a Keyring looks at its files
// for a change.
const CheckEveryDefault = time.Second

// key is one token, as its digest.
type key struct {
	sum  [sha256.Size]byte
	role Role
}

// Keyring maps bearer tokens to roles. A nil *Keyring holds no token: the
// server is open, every request has the operator role.
type Keyring struct {
	files      Files
	logger     *slog.Logger
	checkEvery time.Duration

	mu      sync.Mutex
	keys    []key
	seen    map[string]os.FileInfo // path → what it was at the last load
	checked time.Time
}

// Load reads the token files. No file at all: nil, nil (an open server).
// An agent or read token file needs an operator one beside it, and a token
// may not appear in two roles' files.
func Load(files Files, logger *slog.Logger) (*Keyring, error) {
	if files.Empty() {
		return nil, nil
	}
	if files.Operator == "" {
		return nil, errors.New("--agent-token-file and --read-token-file need --token-file too (the operator's tokens)")
	}
	if logger == nil {
		logger = slog.Default()
	}
	k := &Keyring{files: files, logger: logger, checkEvery: CheckEveryDefault}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// SetCheckEvery sets how often, at most, the files are looked at for a
// change (CheckEveryDefault; tests use less).
func (k *Keyring) SetCheckEvery(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.checkEvery = d
}

// Reload reads every token file now. On an error the tokens are left as
// they were.
func (k *Keyring) Reload() error {
	var keys []key
	seen := map[string]os.FileInfo{}
	roleOf := map[[sha256.Size]byte]string{} // digest → flag, for duplicates
	for _, rf := range k.files.each() {
		info, err := os.Stat(rf.path)
		if err != nil {
			return fmt.Errorf("%s: %w", rf.flag, err)
		}
		b, err := os.ReadFile(rf.path)
		if err != nil {
			return fmt.Errorf("%s: %w", rf.flag, err)
		}
		tokens, err := ParseTokens(b)
		if err != nil {
			return fmt.Errorf("%s %s: %w", rf.flag, rf.path, err)
		}
		for _, t := range tokens {
			sum := sha256.Sum256([]byte(t))
			if other, dup := roleOf[sum]; dup {
				if other == rf.flag {
					continue
				}
				return fmt.Errorf("%s %s: a token is also in %s: give each role tokens of its own", rf.flag, rf.path, other)
			}
			roleOf[sum] = rf.flag
			keys = append(keys, key{sum: sum, role: rf.role})
		}
		seen[rf.path] = info
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys, k.seen, k.checked = keys, seen, time.Now()
	return nil
}

// Role returns the role of bearer token t, RoleNone when no file holds it.
// A nil Keyring (an open server) gives everyone RoleOperator.
func (k *Keyring) Role(t string) Role {
	if k == nil {
		return RoleOperator
	}
	k.reloadIfChanged()
	sum := sha256.Sum256([]byte(t))
	k.mu.Lock()
	keys := k.keys
	k.mu.Unlock()
	role := RoleNone
	for _, kk := range keys { // every key, whatever matched: constant time
		if subtle.ConstantTimeCompare(sum[:], kk.sum[:]) == 1 {
			role = kk.role
		}
	}
	return role
}

// reloadIfChanged re-reads the files when one changed since the last look
// (another size, modification time or file: an edit, or a new file renamed
// over it), at most once every checkEvery. A change that cannot be read is
// logged once, and the tokens stay as they were until the next change.
func (k *Keyring) reloadIfChanged() {
	k.mu.Lock()
	if time.Since(k.checked) < k.checkEvery {
		k.mu.Unlock()
		return
	}
	k.checked = time.Now()
	seen := k.seen
	k.mu.Unlock()
	now := map[string]os.FileInfo{}
	changed := false
	for path, before := range seen {
		info, err := os.Stat(path)
		if err != nil {
			info = nil
		}
		now[path] = info
		if !sameInfo(before, info) {
			changed = true
		}
	}
	if !changed {
		return
	}
	if err := k.Reload(); err != nil {
		k.mu.Lock()
		k.seen = now // said once; looked at again on the next change
		k.mu.Unlock()
		k.logger.Error("token files changed but cannot be read: keeping the tokens as they were", "err", err)
		return
	}
	k.logger.Info("token files re-read")
}

// sameInfo reports whether two looks at a file saw the same file unchanged
// (nil: it could not be read).
func sameInfo(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}
