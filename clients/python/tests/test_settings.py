"""Settings, URLs, errors and the runtime's decisions: no server needed."""

import math
import os
import tempfile
import unittest
from datetime import datetime, timedelta, timezone
from unittest import mock

import _support  # noqa: F401  (puts vigil_client on the path)
from vigil_client import (
    Agent,
    BadRequestError,
    Client,
    EnvError,
    LeaseLostError,
    NotFoundError,
    Settings,
    SettingsError,
    VigilError,
    connection_from_env,
    env_prefix,
    last_activity,
    parse_interval,
    settings_from_env,
    touch_activity,
)
from vigil_client import _decide as decide
from vigil_client.errors import error_for, is_instance_gone
from vigil_client.settings import go_quote, parse_go_duration

RULE = "must be a positive duration like 30s"


class EnvPrefixTest(unittest.TestCase):
    def test_env_prefix(self):
        self.assertEqual(env_prefix("worker"), "VIGIL_WORKER_")
        self.assertEqual(env_prefix("fork-resolution"), "VIGIL_FORK_RESOLUTION_")
        self.assertEqual(env_prefix("critic.v2"), "VIGIL_CRITIC_V2_")


class ParseIntervalTest(unittest.TestCase):
    def test_good(self):
        for text, want in [
            ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("30", 30.0), ("0.5", 0.5), (" 2 ", 2.0),
            ("1e1", 10.0), ("1h", 3600.0), ("1.5h", 5400.0), ("250us", 0.00025), ("250µs", 0.00025),
            ("+2s", 2.0), ("0x1p1", 2.0),
        ]:
            with self.subTest(text=text):
                self.assertAlmostEqual(parse_interval(text), want, places=9)

    def test_bad(self):
        # The Go SDK's table (vigilclient/settings_test.go), word for word.
        for bad in ["-1", "0", "0s", "-5s", "abc", "NaN", "nan", "Inf", "+Inf", "-Inf", "infinity", "1e300", "",
                    "30 s", "1e-12", "5x", "1_000", "s", ".s", "1..5s"]:
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError) as cm:
                    parse_interval(bad)
                self.assertIn(RULE, str(cm.exception))

    def test_go_duration(self):
        self.assertEqual(parse_go_duration("1h2m3.5s"), (3600 + 120 + 3) * 10**9 + 500_000_000)
        self.assertEqual(parse_go_duration("-1.5h"), -5400 * 10**9)
        self.assertEqual(parse_go_duration("0"), 0)
        self.assertEqual(parse_go_duration("1.0000000000000000000001s"), 10**9)
        for bad in ["", "1", "1x", "9999999999999999999h", "-", "+"]:
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                parse_go_duration(bad)

    def test_go_quote(self):
        self.assertEqual(go_quote("-1"), '"-1"')
        self.assertEqual(go_quote('a"b\\c\n\t'), '"a\\"b\\\\c\\n\\t"')
        self.assertEqual(go_quote("\x01é"), '"\\x01é"')


class SettingsFromEnvTest(unittest.TestCase):
    def test_defaults(self):
        self.assertEqual(settings_from_env("worker", {}), Settings(30.0, 60.0, 5.0))
        s = settings_from_env("worker", {"VIGIL_WORKER_POLL_INTERVAL": "  "})
        self.assertEqual(s.poll_interval, 5.0, "blank means unset")

    def test_independent(self):
        s = settings_from_env("fork-resolution", {
            "VIGIL_FORK_RESOLUTION_LIVENESS_INTERVAL": "10",
            "VIGIL_FORK_RESOLUTION_HEARTBEAT_INTERVAL": "1m",
            "VIGIL_WORKER_POLL_INTERVAL": "1s",  # another kind's: ignored
        })
        self.assertEqual(s, Settings(liveness_interval=10.0, heartbeat_interval=60.0, poll_interval=5.0))

    def test_bad_values_name_the_variable(self):
        for bad in ["-1", "0", "abc", "NaN", "Inf", "-3s"]:
            for suffix in ["LIVENESS_INTERVAL", "HEARTBEAT_INTERVAL", "POLL_INTERVAL"]:
                name = "VIGIL_WORKER_" + suffix
                with self.subTest(var=name, value=bad):
                    with self.assertRaises(SettingsError) as cm:
                        settings_from_env("worker", {name: bad})
                    self.assertEqual(str(cm.exception), f'{name}="{bad}": {RULE}')
                    (err,) = cm.exception.errors
                    self.assertIsInstance(err, EnvError)
                    self.assertEqual((err.var, err.value, err.rule), (name, bad, RULE))

    def test_exact_message(self):
        with self.assertRaises(SettingsError) as cm:
            settings_from_env("worker", {"VIGIL_WORKER_LIVENESS_INTERVAL": "-1"})
        self.assertEqual(str(cm.exception), 'VIGIL_WORKER_LIVENESS_INTERVAL="-1": must be a positive duration like 30s')

    def test_reports_every_bad_variable(self):
        with self.assertRaises(SettingsError) as cm:
            settings_from_env("worker", {
                "VIGIL_WORKER_LIVENESS_INTERVAL": "-1",
                "VIGIL_WORKER_HEARTBEAT_INTERVAL": "10s",
                "VIGIL_WORKER_POLL_INTERVAL": "abc",
            })
        self.assertEqual(str(cm.exception).splitlines(), [
            f'VIGIL_WORKER_LIVENESS_INTERVAL="-1": {RULE}',
            f'VIGIL_WORKER_POLL_INTERVAL="abc": {RULE}',
        ])

    def test_needs_kind(self):
        with self.assertRaises(SettingsError):
            settings_from_env("", {})

    def test_reads_os_environ(self):
        with mock.patch.dict(os.environ, {"VIGIL_CRITIC_V2_POLL_INTERVAL": "250ms"}):
            self.assertEqual(settings_from_env("critic.v2").poll_interval, 0.25)

    def test_validate(self):
        Settings().validate()
        with self.assertRaises(SettingsError) as cm:
            Settings(liveness_interval=-1, poll_interval=math.nan).validate()
        self.assertIn("Settings.liveness_interval", str(cm.exception))
        self.assertIn("Settings.poll_interval", str(cm.exception))

    def test_agent_fails_at_start_naming_the_variable(self):
        env = {"VIGIL_WORKER_LIVENESS_INTERVAL": "-1", "VIGIL_WORKER_POLL_INTERVAL": "abc", "VIGIL_URL": "http://127.0.0.1:1"}
        with mock.patch.dict(os.environ, env):
            with self.assertRaises(SettingsError) as cm:
                Agent("worker", {"sleep": lambda t: None})
        self.assertIn(f'VIGIL_WORKER_LIVENESS_INTERVAL="-1": {RULE}', str(cm.exception))
        self.assertIn(f'VIGIL_WORKER_POLL_INTERVAL="abc": {RULE}', str(cm.exception))

    def test_agent_rejects_bad_config(self):
        s = Settings(0.1, 0.1, 0.1)
        c = Client("http://127.0.0.1:1")
        with self.assertRaises(ValueError):
            Agent("", {}, settings=s, client=c)
        with self.assertRaises(ValueError):
            Agent("w", {"t": "not callable"}, settings=s, client=c)  # type: ignore[dict-item]
        with self.assertRaises(ValueError):
            Agent("w", {}, settings=s, client=c, drain_grace=-1)
        with self.assertRaises(SettingsError):
            Agent("w", {}, settings=Settings(liveness_interval=0), client=c)


class ConnectionFromEnvTest(unittest.TestCase):
    def test_urls(self):
        self.assertEqual(connection_from_env({}), (["http://127.0.0.1:7711"], None))
        urls, _ = connection_from_env({"VIGIL_URL": " http://a:1 , ,http://b:2/vigil/ "})
        self.assertEqual(urls, ["http://a:1", "http://b:2/vigil/"])

    def test_token_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "token")
            with open(path, "w") as f:
                f.write("  s3cret-token-0123456789\n")
            self.assertEqual(connection_from_env({"VIGIL_TOKEN_FILE": path})[1], "s3cret-token-0123456789")
            # A server's token file with several tokens (a rotation): the first.
            with open(path, "w") as f:
                f.write("# rotated\n\n  new-token-0123456789  \nold-token-0123456789\n")
            self.assertEqual(connection_from_env({"VIGIL_TOKEN_FILE": path})[1], "new-token-0123456789")
            with open(path, "w") as f:
                f.write("# only a comment\n")
            with self.assertRaises(SettingsError):
                connection_from_env({"VIGIL_TOKEN_FILE": path})
            open(path, "w").close()
            with self.assertRaises(SettingsError) as cm:
                connection_from_env({"VIGIL_TOKEN_FILE": path})
            self.assertIn(f'VIGIL_TOKEN_FILE="{path}": the file must hold the server token', str(cm.exception))
            missing = os.path.join(d, "nope")
            with self.assertRaises(SettingsError) as cm:
                connection_from_env({"VIGIL_TOKEN_FILE": missing})
            self.assertIn(f'VIGIL_TOKEN_FILE="{missing}": read the server token', str(cm.exception))

    def test_client_validates_urls(self):
        for bad in ["", "127.0.0.1:7711", "ftp://h/", "http://", "http:///x"]:
            with self.subTest(url=bad), self.assertRaises(ValueError):
                Client([bad])
        c = Client("http://a:1/vigil/?q=1#f, https://b")
        self.assertEqual(c.urls, ["http://a:1/vigil", "https://b"])


class ErrorsTest(unittest.TestCase):
    def body(self, code):
        return ('{"error":{"code":"%s","message":"m"}}' % code).encode()

    def test_classes_by_code(self):
        for status, code, cls in [
            (409, "stale_epoch", LeaseLostError),
            (404, "not_found", NotFoundError),
            (400, "invalid", BadRequestError),
            (400, "malformed_json", BadRequestError),
            (403, "invalid_token", VigilError),
            (409, "instance_exited", VigilError),
            (409, "instance_stopped", VigilError),
            (401, "unauthorized", VigilError),
        ]:
            with self.subTest(code=code):
                e = error_for(status, self.body(code), op="do x")
                self.assertIs(type(e), cls)
                self.assertEqual((e.status, e.code, e.message), (status, code, "m"))
                self.assertEqual(str(e), f"do x: m (HTTP {status} {code})")
                self.assertFalse(e.transient)

    def test_not_the_api_shape(self):
        e = error_for(502, b"<html>bad gateway</html>")
        self.assertIs(type(e), VigilError)
        self.assertEqual((e.status, e.code, e.message), (502, "", "<html>bad gateway</html>"))
        self.assertTrue(e.transient)
        self.assertEqual(error_for(503, b"").message, "Service Unavailable")

    def test_instance_gone(self):
        self.assertTrue(is_instance_gone(error_for(404, self.body("not_found"))))
        self.assertTrue(is_instance_gone(error_for(403, self.body("invalid_token"))))
        self.assertTrue(is_instance_gone(error_for(409, self.body("instance_exited"))))
        self.assertFalse(is_instance_gone(error_for(409, self.body("instance_stopped"))))
        self.assertFalse(is_instance_gone(error_for(500, self.body("internal"))))


class DecideTest(unittest.TestCase):
    def test_lease_window(self):
        row = {"last_heartbeat_at": "2026-01-01T00:00:00.000Z", "lease_expires_at": "2026-01-01T00:05:00.000Z"}
        self.assertEqual(decide.lease_window(row), (300.0, True))
        self.assertEqual(decide.lease_window({"lease_timeout_s": 2}), (2.0, True))
        stale = {"last_heartbeat_at": "2026-01-01T00:00:03.000Z", "lease_expires_at": "2026-01-01T00:00:02.500Z",
                 "lease_timeout_s": 2}
        self.assertEqual(decide.lease_window(stale), (-0.5, True), "an activity-gated renewal past its window extends nothing")
        self.assertEqual(decide.lease_window({"lease_timeout_s": 0}), (0.0, False))
        self.assertEqual(decide.lease_window(None), (0.0, False))

    def test_alive_window_and_fence(self):
        self.assertEqual(decide.alive_window(0.5), 1.5)
        self.assertEqual(decide.alive_window(30), 90.0)
        self.assertFalse(decide.fence_needed(10.0, 9.0, 1.5))
        self.assertTrue(decide.fence_needed(10.5, 9.0, 1.5))
        self.assertTrue(decide.lease_expired(5.0, 5.0))
        self.assertEqual(decide.lease_deadline(1.0, 2.0), 3.0)

    def test_timeouts_and_backoffs(self):
        self.assertEqual(decide.call_timeout(1.0), decide.CALL_TIMEOUT_FLOOR)
        self.assertEqual(decide.call_timeout(0.05), decide.CALL_TIMEOUT_FLOOR)
        self.assertEqual(decide.call_timeout(8.0), 6.4)
        self.assertEqual(decide.call_timeout(60), 10.0)
        self.assertEqual([decide.outcome_backoff(n) for n in range(1, 7)], [0.25, 0.5, 1.0, 2.0, 4.0, 4.0])
        # A finished result is kept while the lease may be valid, past the
        # old fixed budget of ~4s, and not past it, nor past a stopping
        # agent's budget (issue #12).
        keep_until = decide.lease_surely_over(1000.0, 60.0)
        self.assertEqual(keep_until, 1060.0)
        self.assertFalse(decide.outcome_give_up(1010.0, keep_until, None))
        self.assertTrue(decide.outcome_give_up(1060.0, keep_until, None))
        self.assertTrue(decide.outcome_give_up(1020.0, keep_until, 1020.0))
        self.assertEqual([decide.register_backoff(n, 30) for n in (1, 2, 5, 6, 40)], [1, 2, 16, 30, 30])
        self.assertEqual(decide.register_backoff(3, 120), 4)
        self.assertEqual(decide.register_backoff(10, 120), 60)

    def test_times(self):
        t = decide.parse_time("2026-11-30T06:21:00.12Z")
        self.assertEqual(t, datetime(2026, 11, 30, 6, 21, 0, 120000, tzinfo=timezone.utc))
        self.assertEqual(decide.parse_time("2026-11-30T08:21:00+02:00"), datetime(2026, 11, 30, 6, 21, tzinfo=timezone.utc))
        at = datetime(2026, 1, 2, 3, 4, 5, 678999, tzinfo=timezone(timedelta(hours=1)))
        self.assertEqual(decide.format_time(at), "2026-01-02T02:04:05.678Z")
        with self.assertRaises(ValueError):
            decide.format_time(datetime(2026, 1, 1))
        self.assertEqual([decide.format_duration(s) for s in (0.5, 2, 1.5, 90, 300, 7200)],
                         ["500ms", "2s", "1.5s", "1m30s", "5m0s", "2h0m0s"])


class ActivityFileTest(unittest.TestCase):
    def test_touch_activity(self):
        with tempfile.TemporaryDirectory() as wd:
            self.assertIsNone(touch_activity(wd), "no .vigil/ there: left alone, as vigil touch-activity does")
            self.assertFalse(os.path.exists(os.path.join(wd, ".vigil")))
            self.assertIsNone(last_activity(wd))

            before = datetime.now(timezone.utc) - timedelta(seconds=2)
            path = touch_activity(wd, create=True)
            self.assertEqual(path, os.path.join(os.path.abspath(wd), ".vigil", "last-activity"))
            self.assertEqual(os.stat(os.path.join(wd, ".vigil")).st_mode & 0o777, 0o700)
            first = last_activity(wd)
            self.assertGreaterEqual(first, before)

            os.utime(path, (1_000_000, 1_000_000))  # long ago
            self.assertEqual(touch_activity(wd), path, "with .vigil/ there it touches without create")
            self.assertGreaterEqual(last_activity(wd), before)

            with mock.patch.dict(os.environ, {"VIGIL_WORKDIR": wd}):
                os.utime(path, (1_000_000, 1_000_000))
                self.assertEqual(touch_activity(), path)
                self.assertGreaterEqual(last_activity(wd), before)

            with self.assertRaises(FileNotFoundError):
                touch_activity(os.path.join(wd, "gone"), create=True)
            with self.assertRaises(NotADirectoryError):
                touch_activity(path)


if __name__ == "__main__":
    unittest.main()
