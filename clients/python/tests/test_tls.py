"""The Python client and the example worker against `vigil serve --tls-cert
--tls-key`: trusting the test CA through ca_file= or VIGIL_CA_FILE, and a
clear certificate error without it.

The certificates come from the Go side (clients/python/python_test.go makes
a throwaway CA and a server certificate for 127.0.0.1 and localhost, and
names them in VIGIL_TEST_CA_FILE, VIGIL_TEST_TLS_CERT and
VIGIL_TEST_TLS_KEY); run outside `go test` without them, these tests skip."""

import os
import ssl
import unittest

from _support import VigilTestCase, eventually
from vigil_client import Client, SettingsError, UnreachableError

CA = os.environ.get("VIGIL_TEST_CA_FILE", "")
CERT = os.environ.get("VIGIL_TEST_TLS_CERT", "")
KEY = os.environ.get("VIGIL_TEST_TLS_KEY", "")


@unittest.skipUnless(CA and CERT and KEY, "needs VIGIL_TEST_CA_FILE, VIGIL_TEST_TLS_CERT, VIGIL_TEST_TLS_KEY "
                     "(go test ./clients/python/ sets them)")
class TLSTest(VigilTestCase):
    def test_client_and_worker_over_https(self):
        url = self.start_server("--tls-cert", CERT, "--tls-key", KEY)
        self.assertTrue(url.startswith("https://127.0.0.1:"), url)

        c = Client(url, ca_file=CA)
        c.health()
        env_client = Client.from_env({"VIGIL_URL": url, "VIGIL_CA_FILE": CA})
        env_client.health()

        w = self.start_worker(url, extra={"VIGIL_CA_FILE": CA})
        queued = c.enqueue("py_sleep", {"seconds": 0.1})
        eventually(30, "the worker to complete the task over https",
                   lambda: c.get_task(queued["task_id"])["status"] == "completed")
        done = c.get_task(queued["task_id"])
        self.assertEqual(done["result"]["pid"], w.pid)

    def test_without_the_ca_the_certificate_is_refused(self):
        url = self.start_server("--tls-cert", CERT, "--tls-key", KEY)
        with self.assertRaises(UnreachableError) as cm:
            Client(url).health()
        msg = str(cm.exception)
        self.assertIn("CERTIFICATE_VERIFY_FAILED", msg)
        self.assertIn("give ca_file= or VIGIL_CA_FILE", msg)

    def test_bad_ca_file_is_an_error_naming_it(self):
        missing = os.path.join(self.tmp, "missing.pem")
        with self.assertRaises(SettingsError) as cm:
            Client.from_env({"VIGIL_URL": "https://127.0.0.1:9", "VIGIL_CA_FILE": missing})
        self.assertIn(f'VIGIL_CA_FILE="{missing}": read the CA certificates', str(cm.exception))
        garbage = os.path.join(self.tmp, "garbage.pem")
        with open(garbage, "w", encoding="utf-8") as f:
            f.write("hello")
        with self.assertRaises(ValueError) as cm2:
            Client("https://127.0.0.1:9", ca_file=garbage)
        self.assertIn(f"ca_file {garbage!r}: read the CA certificates", str(cm2.exception))
        with self.assertRaises(ValueError) as cm3:
            Client("https://127.0.0.1:9", ca_file=CA, ssl_context=ssl.create_default_context())
        self.assertIn("give ca_file or ssl_context, not both", str(cm3.exception))


if __name__ == "__main__":
    unittest.main()
