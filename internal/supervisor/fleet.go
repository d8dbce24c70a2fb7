package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// EnvKind is the environment variable through which a supervised process
// learns its kind: the supervisor sets it to the agent's name (DESIGN §1,
// "A supervised agent's processes report its name as their kind"). A fleet
// file or Config.ExtraEnv may not set it.
const EnvKind = "VIGIL_KIND"

// Fleet is the parsed content of a fleet file: the agents `vigil up` keeps
// running.
type Fleet struct {
	Agents []Agent
}

// Agent is one always-on process the supervisor launches and restarts.
type Agent struct {
	// Name identifies the agent in logs and status, and is passed to the child
	// as VIGIL_KIND. Required; [A-Za-z0-9_.-], 1 to 128 characters; unique
	// within a fleet.
	Name string
	// Command is the argv to execute; Command[0] is looked up in the
	// supervisor's PATH unless it contains a slash, in which case a relative
	// path is relative to Dir. Required, non-empty.
	Command []string
	// Env holds variables added last to the child's environment, so they
	// override the supervisor's own environment and Config.ExtraEnv.
	// Optional; may not set VIGIL_KIND.
	Env map[string]string
	// Dir is the child's working directory. LoadFleet makes it absolute: a
	// relative dir is resolved against the fleet file's directory, and an
	// empty dir means that directory; it then checks that the directory
	// exists. ParseFleet, which knows no file, leaves it as written and
	// unchecked (empty: the supervisor's working directory).
	Dir string
	// StartupTimeout, when set, is how long a launched agent has to
	// register its process instance with the server (an agent on the SDK
	// does so first thing); one that has not is killed, a startup_timeout
	// event is recorded, and it is restarted with backoff. Zero: no check
	// (for agents that do not register). Fleet file: startup_timeout: 60s.
	StartupTimeout time.Duration
}

// agentNameRE is the allowed shape of Agent.Name.
var agentNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// LoadFleet reads and validates the fleet file at path (see ParseFleet for
// the format), resolves every agent's Dir against the file's directory and
// checks that each resolved Dir is an existing directory, reporting e.g.
// `agents[0].dir: /abs/path: no such directory (agent "w")`.
func LoadFleet(path string) (*Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load fleet: %w", err)
	}
	baseDir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("load fleet %s: %w", path, err)
	}
	fleet, err := parseFleet(data)
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", path, err)
	}
	var errs []error
	for i := range fleet.Agents {
		a := &fleet.Agents[i]
		switch {
		case a.Dir == "":
			a.Dir = baseDir
		case !filepath.IsAbs(a.Dir):
			a.Dir = filepath.Join(baseDir, a.Dir)
		default:
			a.Dir = filepath.Clean(a.Dir)
		}
		if err := checkDir(a.Dir); err != nil {
			errs = append(errs, fmt.Errorf("agents[%d].dir: %s: %s (agent %q)", i, a.Dir, err, a.Name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("fleet %s: %w", path, errors.Join(errs...))
	}
	return fleet, nil
}

// checkDir reports why dir cannot be a working directory, so that a missing
// one is named at load time rather than surfacing at launch as the command's
// "fork/exec ...: no such file or directory". The returned error is plain
// text and deliberately does not wrap os.ErrNotExist: callers take that to
// mean the fleet file itself is missing.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return errors.New("no such directory")
	case err != nil:
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the caller names the path
		}
		return errors.New(err.Error()) // e.g. "permission denied", "not a directory"
	case !fi.IsDir():
		return errors.New("not a directory")
	}
	return nil
}

// ParseFleet parses and validates a fleet document:
//
//	agents:
//	  - name: worker-1                                # required, unique, [A-Za-z0-9_.-]{1,128}
//	    command: ["go", "run", "./examples/worker"]   # required argv, non-empty
//	    env: {VIGIL_WORKER_LIVENESS_INTERVAL: "5s"}   # optional
//	    dir: "."                                      # optional working directory
//
// Unknown keys, repeated keys and more than one YAML document are errors. All
// problems found are reported together, each naming the agent's index and
// field, e.g. `agents[1].command: must not be empty (agent "worker-2")`.
// Dir is returned as written; LoadFleet resolves it against the file.
func ParseFleet(data []byte) (*Fleet, error) {
	fleet, err := parseFleet(data)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	return fleet, nil
}

// agentFields are the keys an agent mapping may hold.
var agentFields = []string{"name", "command", "env", "dir", "startup_timeout"}

// parseFleet decodes the document node by node rather than with a strict
// yaml.Decoder (KnownFields) into structs, so that every error — unknown key
// and wrong type included — can name the agent and field it is about.
func parseFleet(data []byte) (*Fleet, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New(`empty document: want a mapping with an "agents" list`)
		}
		return nil, yamlError(data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one YAML document")
	}

	root := deref(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = deref(root.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf(`line %d: top level must be a mapping with an "agents" list`, root.Line)
	}

	var errs []error
	var agentsNode *yaml.Node
	for _, kv := range mappingPairs(root, "", &errs) {
		if kv.key != "agents" {
			errs = append(errs, fmt.Errorf("line %d: unknown field %q (known: agents)", kv.line, kv.key))
			continue
		}
		agentsNode = deref(kv.value)
	}
	switch {
	case agentsNode == nil || isNull(agentsNode):
		errs = append(errs, errors.New("agents: must list at least one agent"))
		return nil, errors.Join(errs...)
	case agentsNode.Kind != yaml.SequenceNode:
		errs = append(errs, fmt.Errorf("agents: must be a list (line %d)", agentsNode.Line))
		return nil, errors.Join(errs...)
	case len(agentsNode.Content) == 0:
		errs = append(errs, errors.New("agents: must list at least one agent"))
	}

	fleet := &Fleet{Agents: make([]Agent, 0, len(agentsNode.Content))}
	for i, item := range agentsNode.Content {
		a, itemErrs := parseAgent(i, deref(item))
		errs = append(errs, itemErrs...)
		fleet.Agents = append(fleet.Agents, a)
	}
	if len(errs) == 0 {
		// Values are checked once the shape is right, so that a field of the
		// wrong type is not also reported as missing.
		errs = validateAgents(fleet.Agents)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return fleet, nil
}

// parseAgent decodes agents[i]. Type errors are returned; value checks are
// left to validateAgents.
func parseAgent(i int, n *yaml.Node) (Agent, []error) {
	var a Agent
	var errs []error
	at := fmt.Sprintf("agents[%d]", i)
	if n.Kind != yaml.MappingNode {
		return a, []error{fmt.Errorf("%s: must be a mapping with name and command (line %d)", at, n.Line)}
	}
	for _, kv := range mappingPairs(n, at, &errs) {
		field := at + "." + kv.key
		v := deref(kv.value)
		switch kv.key {
		case "name", "dir":
			if v.Kind != yaml.ScalarNode {
				errs = append(errs, fmt.Errorf("%s: must be a string (line %d)", field, v.Line))
				continue
			}
			if isNull(v) {
				continue
			}
			if kv.key == "name" {
				a.Name = v.Value
			} else {
				a.Dir = v.Value
			}
		case "command":
			if isNull(v) {
				continue
			}
			if v.Kind != yaml.SequenceNode {
				errs = append(errs, fmt.Errorf(`%s: must be a list of strings (argv), e.g. ["go", "run", "."] (line %d)`, field, v.Line))
				continue
			}
			for j, argNode := range v.Content {
				arg := deref(argNode)
				if arg.Kind != yaml.ScalarNode || isNull(arg) {
					errs = append(errs, fmt.Errorf("%s[%d]: must be a string (line %d)", field, j, arg.Line))
					continue
				}
				a.Command = append(a.Command, arg.Value)
			}
		case "startup_timeout":
			if isNull(v) {
				continue
			}
			d, err := time.ParseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf(`%s: must be a positive duration like "60s" (line %d)`, field, v.Line))
				continue
			}
			a.StartupTimeout = d
		case "env":
			if isNull(v) {
				continue
			}
			if v.Kind != yaml.MappingNode {
				errs = append(errs, fmt.Errorf("%s: must be a mapping of variable names to strings (line %d)", field, v.Line))
				continue
			}
			a.Env = map[string]string{}
			for _, ev := range mappingPairs(v, field, &errs) {
				val := deref(ev.value)
				if val.Kind != yaml.ScalarNode {
					errs = append(errs, fmt.Errorf("%s.%s: must be a string (line %d)", field, ev.key, val.Line))
					continue
				}
				if isNull(val) {
					a.Env[ev.key] = ""
					continue
				}
				a.Env[ev.key] = val.Value
			}
		default:
			errs = append(errs, fmt.Errorf("%s: unknown field %q (line %d; known: %s)",
				at, kv.key, kv.line, strings.Join(agentFields, ", ")))
		}
	}
	return a, errs
}

// validateAgents checks values: names, uniqueness, argv and environment.
// It is shared by ParseFleet and New, so both report in fleet-file terms.
func validateAgents(agents []Agent) []error {
	var errs []error
	seen := make(map[string]int, len(agents))
	for i, a := range agents {
		at := fmt.Sprintf("agents[%d]", i)
		suffix := ""
		switch {
		case a.Name == "":
			errs = append(errs, fmt.Errorf("%s.name: required", at))
		case !agentNameRE.MatchString(a.Name):
			errs = append(errs, fmt.Errorf("%s.name: %q must be 1 to 128 characters from [A-Za-z0-9_.-]", at, a.Name))
		default:
			suffix = fmt.Sprintf(" (agent %q)", a.Name)
			if first, dup := seen[a.Name]; dup {
				errs = append(errs, fmt.Errorf("%s.name: %q is already used by agents[%d]", at, a.Name, first))
			} else {
				seen[a.Name] = i
			}
		}
		switch {
		case len(a.Command) == 0:
			errs = append(errs, fmt.Errorf("%s.command: must not be empty%s", at, suffix))
		case a.Command[0] == "":
			errs = append(errs, fmt.Errorf("%s.command[0]: must not be empty%s", at, suffix))
		}
		for _, arg := range a.Command {
			if strings.IndexByte(arg, 0) >= 0 {
				errs = append(errs, fmt.Errorf("%s.command: arguments must not contain NUL bytes%s", at, suffix))
				break
			}
		}
		for _, k := range sortedKeys(a.Env) {
			if err := checkEnvVar(k, a.Env[k]); err != nil {
				errs = append(errs, fmt.Errorf("%s.env: %w%s", at, err, suffix))
			}
		}
	}
	return errs
}

// checkEnvVar rejects names and values the child's environment cannot carry,
// and VIGIL_KIND, which the supervisor owns.
func checkEnvVar(k, v string) error {
	switch {
	case k == "":
		return errors.New("variable name must not be empty")
	case strings.ContainsAny(k, "=\x00"):
		return fmt.Errorf("variable name %q must not contain '=' or NUL", k)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("value of %s must not contain NUL", k)
	case k == EnvKind:
		return fmt.Errorf("%s is set by the supervisor to the agent's name", EnvKind)
	}
	return nil
}

// keyValue is one entry of a YAML mapping.
type keyValue struct {
	key   string
	line  int
	value *yaml.Node
}

// mappingPairs lists a mapping's entries, reporting non-scalar and repeated
// keys (which a yaml.Node does not check) under the path at.
func mappingPairs(n *yaml.Node, at string, errs *[]error) []keyValue {
	prefix := ""
	if at != "" {
		prefix = at + ": "
	}
	pairs := make([]keyValue, 0, len(n.Content)/2)
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := deref(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			*errs = append(*errs, fmt.Errorf("%skeys must be strings (line %d)", prefix, k.Line))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			*errs = append(*errs, fmt.Errorf("%sfield %q repeated (lines %d and %d)", prefix, k.Value, first, k.Line))
			continue
		}
		seen[k.Value] = k.Line
		pairs = append(pairs, keyValue{key: k.Value, line: k.Line, value: n.Content[i+1]})
	}
	return pairs
}

// deref follows YAML aliases (*anchor) to the node they point at.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// yamlError gives a YAML syntax error the line yaml.v3 leaves out of it: it
// writes "line N: " only past the first line, and never for a byte its
// reader refuses (invalid UTF-8, a control character), so that `"` alone
// would be reported as just "yaml: found unexpected end of stream".
func yamlError(data []byte, err error) error {
	msg, ok := strings.CutPrefix(err.Error(), "yaml: ")
	if !ok || strings.HasPrefix(msg, "line ") {
		return err
	}
	line := 1
	if i := unreadableOffset(data); i >= 0 {
		line += bytes.Count(data[:i], []byte{'\n'})
	}
	return fmt.Errorf("yaml: line %d: %s", line, msg)
}

// unreadableOffset is the offset of the first byte of data that is not
// valid UTF-8 or is a character YAML does not allow (yaml.v3's reader
// check), -1 when there is none.
func unreadableOffset(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return i
		case r == '\t', r == '\n', r == '\r', r >= 0x20 && r <= 0x7E, r == 0x85,
			r >= 0xA0 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r >= 0x10000 && r <= utf8.MaxRune:
		default:
			return i
		}
		i += size
	}
	return -1
}
