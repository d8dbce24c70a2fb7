package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestLoadFleet(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub", "dir"), 0o700))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "y"), 0o700))
	path := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
# the examples' fleet
agents:
  - name: worker-1
    command: ["go", "run", "./examples/worker"]
    env: {VIGIL_WORKER_LIVENESS_INTERVAL: "5s", EMPTY: ""}
    dir: "."
  - name: critic.v2_b
    command:
      - /usr/bin/env
      - ""
    dir: sub/dir
  - name: abs
    command: [sleep, 1]
    dir: `+dir+`/x/../y
`), 0o600))

	fleet, err := LoadFleet(path)
	require.NoError(t, err)
	require.Equal(t, &Fleet{Agents: []Agent{
		{
			Name:    "worker-1",
			Command: []string{"go", "run", "./examples/worker"},
			Env:     map[string]string{"VIGIL_WORKER_LIVENESS_INTERVAL": "5s", "EMPTY": ""},
			Dir:     dir,
		},
		{Name: "critic.v2_b", Command: []string{"/usr/bin/env", ""}, Dir: filepath.Join(dir, "sub", "dir")},
		{Name: "abs", Command: []string{"sleep", "1"}, Dir: filepath.Join(dir, "y")}, // cleaned
	}}, fleet)
}

func TestLoadFleetRelativePathDefaultsDirToFileDir(t *testing.T) {
	// Not parallel: changes the working directory.
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f.yml"), []byte("agents: [{name: a, command: [x]}]\n"), 0o600))
	t.Chdir(dir)

	fleet, err := LoadFleet("f.yml")
	require.NoError(t, err)
	require.Equal(t, dir, fleet.Agents[0].Dir) // absolute, so it survives a later chdir
}

func TestLoadFleetErrors(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	_, err := LoadFleet(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, "load fleet")

	path := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(path, []byte("agents:\n  - name: a\n    command: []\n"), 0o600))
	_, err = LoadFleet(path)
	require.EqualError(t, err, fmt.Sprintf(`fleet %s: agents[0].command: must not be empty (agent "a")`, path))
}

// TestLoadFleetDirMustExist: a dir that is not an existing directory is
// reported by LoadFleet, naming the field and the resolved path, rather than
// at launch as the command's "fork/exec ...: no such file or directory".
func TestLoadFleetDirMustExist(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "ok"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "file.txt"), nil, 0o600))
	require.NoError(t, os.Symlink("ok", filepath.Join(dir, "link-ok")))
	require.NoError(t, os.Symlink("gone", filepath.Join(dir, "link-dangling")))
	missingAbs := filepath.Join(dir, "nowhere", "abs")

	tests := []struct {
		name string
		yaml string
		want []string // the error lines after "fleet PATH: "; nil: no error
	}{
		{"Relative", "agents: [{name: w, command: [x], dir: ok}]\n", nil},
		{"SymlinkToDir", "agents: [{name: w, command: [x], dir: link-ok}]\n", nil},
		{"Empty", "agents: [{name: w, command: [x]}]\n", nil},
		{
			"MissingRelative", "agents: [{name: w, command: [sleep, 1], dir: missing}]\n",
			[]string{`agents[0].dir: ` + filepath.Join(dir, "missing") + `: no such directory (agent "w")`},
		},
		{
			"MissingAbsolute", "agents: [{name: w, command: [x], dir: '" + missingAbs + "/'}]\n",
			[]string{`agents[0].dir: ` + missingAbs + `: no such directory (agent "w")`},
		},
		{
			"DanglingSymlink", "agents: [{name: w, command: [x], dir: link-dangling}]\n",
			[]string{`agents[0].dir: ` + filepath.Join(dir, "link-dangling") + `: no such directory (agent "w")`},
		},
		{
			"IsAFile", "agents: [{name: w, command: [x], dir: file.txt}]\n",
			[]string{`agents[0].dir: ` + filepath.Join(dir, "file.txt") + `: not a directory (agent "w")`},
		},
		{
			"UnderAFile", "agents: [{name: w, command: [x], dir: file.txt/sub}]\n",
			[]string{`agents[0].dir: ` + filepath.Join(dir, "file.txt", "sub") + `: not a directory (agent "w")`},
		},
		{
			"SeveralReportedTogether",
			"agents:\n  - {name: a, command: [x], dir: ok}\n  - {name: b, command: [x], dir: m1}\n  - {name: c, command: [x], dir: ../" + filepath.Base(dir) + "/m2}\n",
			[]string{
				`agents[1].dir: ` + filepath.Join(dir, "m1") + `: no such directory (agent "b")`,
				`agents[2].dir: ` + filepath.Join(dir, "m2") + `: no such directory (agent "c")`,
			},
		},
		{
			// Parse errors come first; dirs are checked only in a valid fleet.
			"ParseErrorFirst", "agents: [{name: w, command: [], dir: missing}]\n",
			[]string{`agents[0].command: must not be empty (agent "w")`},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, fmt.Sprintf("fleet-%d.yaml", i))
			require.NoError(t, os.WriteFile(path, []byte(tt.yaml), 0o600))
			fleet, err := LoadFleet(path)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.Nil(t, fleet)
			require.EqualError(t, err, "fleet "+path+": "+strings.Join(tt.want, "\n"))
			// `vigil up` takes ErrNotExist to mean the fleet file is missing.
			require.NotErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestLoadFleetDirPermissionDenied(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		t.Skip("root is not denied")
	}
	dir := t.TempDir()
	locked := filepath.Join(dir, "locked")
	require.NoError(t, os.MkdirAll(filepath.Join(locked, "in"), 0o700))
	require.NoError(t, os.Chmod(locked, 0))
	t.Cleanup(func() { _ = os.Chmod(locked, 0o700) })
	path := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(path, []byte("agents: [{name: w, command: [x], dir: locked/in}]\n"), 0o600))

	_, err := LoadFleet(path)
	require.EqualError(t, err, fmt.Sprintf(`fleet %s: agents[0].dir: %s: permission denied (agent "w")`, path, filepath.Join(locked, "in")))
}

func TestParseFleetKeepsDirAsWritten(t *testing.T) {
	t.Parallel()

	// rel does not exist: ParseFleet, which knows no file, does not check it.
	fleet, err := ParseFleet([]byte("agents:\n  - {name: a, command: [x], dir: rel}\n  - {name: b, command: [y]}\n"))
	require.NoError(t, err)
	require.Equal(t, "rel", fleet.Agents[0].Dir)
	require.Empty(t, fleet.Agents[1].Dir)
	require.Nil(t, fleet.Agents[1].Env)
}

func TestParseFleetAliases(t *testing.T) {
	t.Parallel()

	fleet, err := ParseFleet([]byte(`
agents:
  - name: a
    command: &cmd [go, run, ./w]
    env: &env {K: v}
  - name: b
    command: *cmd
    env: *env
`))
	require.NoError(t, err)
	require.Equal(t, fleet.Agents[0].Command, fleet.Agents[1].Command)
	require.Equal(t, map[string]string{"K": "v"}, fleet.Agents[1].Env)
}

func TestParseFleetStartupTimeout(t *testing.T) {
	t.Parallel()
	fleet, err := ParseFleet([]byte("agents: [{name: a, command: [x], startup_timeout: 90s}]\n"))
	require.NoError(t, err)
	require.Equal(t, 90*time.Second, fleet.Agents[0].StartupTimeout)
}

func TestParseFleetInvalid(t *testing.T) {
	t.Parallel()

	long := strings.Repeat("x", 129)
	tests := []struct {
		name string
		yaml string
		want []string // each must appear in the error
	}{
		{"Empty", "", []string{`fleet: empty document`}},
		{"CommentOnly", "# nothing\n", []string{`fleet: empty document`}},
		{"NotAMapping", "- a\n", []string{`line 1: top level must be a mapping with an "agents" list`}},
		{"Syntax", "agents: [\n", []string{"fleet: yaml:"}},
		// yaml.v3 names no line for a problem on the first, nor for a byte
		// its reader refuses; ParseFleet adds it.
		{"SyntaxOnFirstLine", `"`, []string{"fleet: yaml: line 1: found unexpected end of stream"}},
		{"ControlCharacter", "agents:\n  - name: a\x01\n", []string{"fleet: yaml: line 2: control characters are not allowed"}},
		{"InvalidUTF8", "# ok\n\n\xff: x\n", []string{"fleet: yaml: line 3: invalid leading UTF-8 octet"}},
		{"TwoDocuments", "agents: [{name: a, command: [x]}]\n---\nagents: []\n", []string{"more than one YAML document"}},
		{"UnknownTopLevelKey", "agents: [{name: a, command: [x]}]\nagent: []\n", []string{`line 2: unknown field "agent" (known: agents)`}},
		{"NoAgentsKey", "{}\n", []string{"agents: must list at least one agent"}},
		{"NullAgents", "agents:\n", []string{"agents: must list at least one agent"}},
		{"EmptyAgents", "agents: []\n", []string{"agents: must list at least one agent"}},
		{"AgentsNotAList", "agents: {name: a}\n", []string{"agents: must be a list (line 1)"}},
		{"AgentNotAMapping", "agents: [worker]\n", []string{"agents[0]: must be a mapping with name and command (line 1)"}},
		{"StartupTimeoutNotADuration", "agents: [{name: a, command: [x], startup_timeout: soon}]\n", []string{`agents[0].startup_timeout: must be a positive duration like "60s"`}},
		{"StartupTimeoutNegative", "agents: [{name: a, command: [x], startup_timeout: -5s}]\n", []string{`agents[0].startup_timeout: must be a positive duration`}},
		{
			"UnknownAgentKey", "agents:\n  - name: a\n    command: [x]\n  - name: b\n    comand: [x]\n",
			[]string{`agents[1]: unknown field "comand" (line 5; known: name, command, env, dir, startup_timeout)`},
		},
		{
			"RepeatedKey", "agents:\n  - name: a\n    name: b\n    command: [x]\n",
			[]string{`agents[0]: field "name" repeated (lines 2 and 3)`},
		},
		{"MissingName", "agents: [{command: [x]}]\n", []string{"agents[0].name: required"}},
		{"NullName", "agents: [{name: ~, command: [x]}]\n", []string{"agents[0].name: required"}},
		{"NameNotString", "agents: [{name: [a], command: [x]}]\n", []string{"agents[0].name: must be a string (line 1)"}},
		{"NameBadChars", "agents: [{name: 'my worker', command: [x]}]\n", []string{`agents[0].name: "my worker" must be 1 to 128 characters from [A-Za-z0-9_.-]`}},
		{"NameSlash", "agents: [{name: a/b, command: [x]}]\n", []string{`agents[0].name: "a/b" must be`}},
		{"NameTooLong", "agents: [{name: " + long + ", command: [x]}]\n", []string{`agents[0].name: "` + long + `" must be`}},
		{
			"DuplicateName", "agents:\n  - {name: w, command: [x]}\n  - {name: v, command: [x]}\n  - {name: w, command: [y]}\n",
			[]string{`agents[2].name: "w" is already used by agents[0]`},
		},
		{"MissingCommand", "agents:\n  - {name: a, command: [x]}\n  - {name: b}\n", []string{`agents[1].command: must not be empty (agent "b")`}},
		{"EmptyCommand", "agents:\n  - {name: a, command: [x]}\n  - {name: b, command: []}\n", []string{`agents[1].command: must not be empty (agent "b")`}},
		{"NullCommand", "agents: [{name: a, command: }]\n", []string{`agents[0].command: must not be empty (agent "a")`}},
		{"EmptyArgv0", "agents: [{name: a, command: ['', x]}]\n", []string{`agents[0].command[0]: must not be empty (agent "a")`}},
		{
			"CommandIsAString", "agents: [{name: a, command: go run .}]\n",
			[]string{`agents[0].command: must be a list of strings (argv), e.g. ["go", "run", "."] (line 1)`},
		},
		{"CommandItemNotString", "agents: [{name: a, command: [go, {x: y}]}]\n", []string{"agents[0].command[1]: must be a string (line 1)"}},
		{"CommandItemNull", "agents: [{name: a, command: [go, ~]}]\n", []string{"agents[0].command[1]: must be a string (line 1)"}},
		{"EnvNotAMapping", "agents: [{name: a, command: [x], env: [A=b]}]\n", []string{"agents[0].env: must be a mapping of variable names to strings (line 1)"}},
		{"EnvValueNotString", "agents: [{name: a, command: [x], env: {A: [b]}}]\n", []string{"agents[0].env.A: must be a string (line 1)"}},
		{"EnvNameWithEquals", "agents: [{name: a, command: [x], env: {'A=B': c}}]\n", []string{`agents[0].env: variable name "A=B" must not contain '=' or NUL (agent "a")`}},
		{"EnvNameEmpty", "agents: [{name: a, command: [x], env: {'': c}}]\n", []string{`agents[0].env: variable name must not be empty (agent "a")`}},
		{"EnvSetsKind", "agents: [{name: a, command: [x], env: {VIGIL_KIND: b}}]\n", []string{`agents[0].env: VIGIL_KIND is set by the supervisor to the agent's name (agent "a")`}},
		{"EnvRepeatedName", "agents: [{name: a, command: [x], env: {A: b, A: c}}]\n", []string{`agents[0].env: field "A" repeated`}},
		{"DirNotString", "agents: [{name: a, command: [x], dir: [d]}]\n", []string{"agents[0].dir: must be a string (line 1)"}},
		{
			"SeveralProblemsReportedTogether", "agents:\n  - {name: a}\n  - {name: 'b c', command: [x]}\n",
			[]string{`agents[0].command: must not be empty (agent "a")`, `agents[1].name: "b c" must be`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fleet, err := ParseFleet([]byte(tt.yaml))
			require.Error(t, err)
			require.Nil(t, fleet)
			require.True(t, strings.HasPrefix(err.Error(), "fleet: "), "error %q lacks the fleet: prefix", err)
			for _, want := range tt.want {
				require.ErrorContains(t, err, want)
			}
		})
	}
}

func ExampleParseFleet() {
	fleet, err := ParseFleet([]byte(`
agents:
  - name: worker-1
    command: ["go", "run", "./examples/worker"]
    env: {VIGIL_WORKER_LIVENESS_INTERVAL: "5s"}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, a := range fleet.Agents {
		fmt.Println(a.Name, a.Command, a.Env)
	}

	_, err = ParseFleet([]byte("agents:\n  - {name: worker-1, command: [x]}\n  - {name: worker-2, command: []}\n"))
	fmt.Println(err)
	// Output:
	// worker-1 [go run ./examples/worker] map[VIGIL_WORKER_LIVENESS_INTERVAL:5s]
	// fleet: agents[1].command: must not be empty (agent "worker-2")
}

// fleetYAML writes a Fleet back as a fleet file, for FuzzParseFleet's
// round trip.
type fleetYAML struct {
	Agents []agentYAML `yaml:"agents"`
}

type agentYAML struct {
	Name           string            `yaml:"name"`
	Command        []string          `yaml:"command"`
	Env            map[string]string `yaml:"env,omitempty"`
	Dir            string            `yaml:"dir,omitempty"`
	StartupTimeout string            `yaml:"startup_timeout,omitempty"`
}

// fleetErrorLineRE matches where a fleet error without an agents[i] field
// points: "line 3", "lines 1 and 2".
var fleetErrorLineRE = regexp.MustCompile(`\blines? [0-9]`)

// FuzzParseFleet drives the fleet file parser with arbitrary documents.
// Invariants: no panic; an error starts "fleet: " and each of its lines
// says where the problem is (an agents[i] field, a line, or the document);
// a fleet it accepts has agents, passes validateAgents again, and written
// back as YAML parses to the same fleet.
func FuzzParseFleet(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", "examples", "fleet.yaml")); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"agents:\n  - name: worker-1\n    command: [\"go\", \"run\", \"./examples/worker\"]\n    env: {VIGIL_WORKER_LIVENESS_INTERVAL: \"5s\", EMPTY: \"\"}\n    dir: \".\"\n  - name: critic.v2_b\n    command:\n      - /usr/bin/env\n      - \"\"\n    dir: sub/dir\n",
		"agents:\n  - name: a\n    command: &cmd [go, run, ./w]\n    env: &env {K: v}\n  - name: b\n    command: *cmd\n    env: *env\n",
		"agents: [{name: a, command: [x], startup_timeout: 90s}]\n",
		"agents: [{name: a, command: [x], env: {}, dir: ~, startup_timeout: ~}]\n",
		"agents: [{name: a, command: [x], env: {A: ~, B: 1, C: true, D: '0x1F'}}]\n",
		"agents:\n  - name: a\n    name: b\n    command: [x]\n",
		"agents: [{name: 'my worker', command: [go, {x: y}], env: {'A=B': c, '': d, VIGIL_KIND: e}}]\n",
		"agents: [{name: a, command: ['', \"a\\0b\"], env: {A: \"\\0\"}}]\n",
		"agents: [{name: a, command: [x]}]\n---\nagents: []\n",
		"agents: [\n",
		"- a\n",
		"",
		"{<<: {agents: [{name: a, command: [x]}]}}\n",
		"agents: [{name: a, command: [x], startup_timeout: 1h2m3.5s, dir: \"/tmp/a b\"}]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fleet, err := ParseFleet(data)
		if err != nil {
			require.Nil(t, fleet)
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "fleet: "), "error %q lacks the fleet: prefix", msg)
			for line := range strings.SplitSeq(strings.TrimPrefix(msg, "fleet: "), "\n") {
				require.True(t, strings.Contains(line, "agents") || fleetErrorLineRE.MatchString(line) || strings.Contains(line, "document"),
					"error %q does not say where (input %q)", line, data)
			}
			return
		}
		require.NotEmpty(t, fleet.Agents)
		require.Empty(t, validateAgents(fleet.Agents), "a parsed fleet must re-validate")

		var doc fleetYAML
		for _, a := range fleet.Agents {
			ay := agentYAML{Name: a.Name, Command: a.Command, Env: a.Env, Dir: a.Dir}
			if a.StartupTimeout > 0 {
				ay.StartupTimeout = a.StartupTimeout.String()
			}
			doc.Agents = append(doc.Agents, ay)
		}
		out, err := yaml.Marshal(doc)
		require.NoError(t, err)
		again, err := ParseFleet(out)
		require.NoError(t, err, "written back:\n%s", out)
		for i := range fleet.Agents {
			if len(fleet.Agents[i].Env) == 0 {
				fleet.Agents[i].Env = nil // env: {} is written as no env
			}
		}
		require.Equal(t, fleet, again, "written back:\n%s", out)
	})
}
