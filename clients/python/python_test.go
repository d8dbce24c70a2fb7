// Package pythonclient_test runs the Python client's tests (clients/python,
// package vigil_client) from `go test`, so the CI test command runs them:
// it builds the vigil binary from this checkout and runs
//
//	python3 -m unittest discover -s clients/python/tests -v
//
// with VIGIL_TEST_BIN pointing at it. The Python tests start real `vigil
// serve` and `vigil up` processes and real example workers. For the TLS
// tests it makes a throwaway CA and a server certificate and names them in
// VIGIL_TEST_CA_FILE, VIGIL_TEST_TLS_CERT and VIGIL_TEST_TLS_KEY.
//
// Without python3 the test is skipped, loudly; under CI=true it fails, so
// the Python suite cannot go missing from CI.
package pythonclient_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vigil-fleet/vigil/internal/testcert"
)

func TestPythonClient(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err == nil {
		// vigil_client supports Python 3.9 and newer.
		if out, verr := exec.Command(python, "-c", "import sys; sys.exit(sys.version_info < (3, 9))").CombinedOutput(); verr != nil {
			err = fmt.Errorf("%s is older than Python 3.9 or does not run: %v %s", python, verr, out)
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no usable python3 (CI=true): the Python client's tests cannot run: %v", err)
		}
		t.Skipf("SKIPPED: no usable python3, so the Python client's tests (clients/python/tests) did not run: %v", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}

	bin := filepath.Join(t.TempDir(), "vigil")
	build := exec.Command("go", "build", "-o", bin, "./cmd/vigil")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -o %s ./cmd/vigil: %v\n%s", bin, err, out)
	}

	ca := testcert.NewCA(t, "vigil")
	pair := ca.IssueIn(t, t.TempDir())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "unittest", "discover", "-s", "clients/python/tests", "-v")
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"VIGIL_TEST_BIN="+bin,
		"PYTHONDONTWRITEBYTECODE=1", // leave no __pycache__ in the checkout
		"PYTHONUNBUFFERED=1",
		"VIGIL_TEST_CA_FILE="+ca.File,
		"VIGIL_TEST_TLS_CERT="+pair.CertFile,
		"VIGIL_TEST_TLS_KEY="+pair.KeyFile,
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	if err != nil || testing.Verbose() {
		t.Logf("python3 -m unittest discover -s clients/python/tests -v:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("the Python client's tests failed: %v", err)
	}
}
