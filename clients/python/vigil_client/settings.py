"""Per-process settings from the environment (DESIGN L5), as the Go SDK reads them.

Three independent intervals, each from its own variable; never derive one
from another:

====================================  =======  ==================================
variable                              default  meaning
====================================  =======  ==================================
``VIGIL_<KIND>_LIVENESS_INTERVAL``    30s      liveness heartbeat period
``VIGIL_<KIND>_HEARTBEAT_INTERVAL``   60s      lease heartbeat period (task held)
``VIGIL_<KIND>_POLL_INTERVAL``        5s       idle wait between claims
``VIGIL_URL``                         http://127.0.0.1:7711   servers, comma-separated
``VIGIL_TOKEN_FILE``                  (none)   file holding the server token
``VIGIL_CA_FILE``                     (none)   PEM CA certificates for https:// servers
====================================  =======  ==================================

KIND is upper-cased with ``-`` and ``.`` turned into ``_``. A value is a Go
duration (``"30s"``, ``"1m30s"``, ``"500ms"``) or a plain number of seconds
(``"30"``, ``"0.5"``); an unset or blank variable takes the default. A value
that is not positive, is NaN or infinite, or does not parse is an error that
names the variable, word for word as the Go SDK says it::

    VIGIL_WORKER_LIVENESS_INTERVAL="-1": must be a positive duration like 30s
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

LIVENESS_INTERVAL_DEFAULT = 30.0
"""Seconds between liveness heartbeats (DESIGN L5); the server shows the
instance stopped after 3× this without one (DESIGN L3)."""
HEARTBEAT_INTERVAL_DEFAULT = 60.0
"""Seconds between lease heartbeats while a task is held (DESIGN L5), well
inside the server's default 5 min lease window."""
POLL_INTERVAL_DEFAULT = 5.0
"""Seconds an idle agent waits between claims (DESIGN L5)."""

ENV_LIVENESS_SUFFIX = "LIVENESS_INTERVAL"
ENV_HEARTBEAT_SUFFIX = "HEARTBEAT_INTERVAL"
ENV_POLL_SUFFIX = "POLL_INTERVAL"
ENV_URL = "VIGIL_URL"
ENV_TOKEN_FILE = "VIGIL_TOKEN_FILE"
ENV_CA_FILE = "VIGIL_CA_FILE"
"""Names a PEM file of the CA certificates to trust for an https:// server
(a private CA); the system's roots are then not used."""

URL_DEFAULT = "http://127.0.0.1:7711"
"""Where ``vigil serve`` listens by default (docs/api.md)."""

INTERVAL_RULE = "must be a positive duration like 30s"
"""The rule every interval setting must follow, as users see it."""

_MAX_NS = (1 << 63) - 1


class EnvError(ValueError):
    """A bad value in an environment variable: ``VAR="value": rule``."""

    def __init__(self, var: str, value: str, rule: str) -> None:
        super().__init__(f"{var}={go_quote(value)}: {rule}")
        self.var = var
        self.value = value
        self.rule = rule


class SettingsError(ValueError):
    """One or more bad settings; ``errors`` lists each (usually EnvError),
    and the message has one line per error, each naming its variable."""

    def __init__(self, errors: Sequence[ValueError]) -> None:
        self.errors: List[ValueError] = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


@dataclass(frozen=True)
class Settings:
    """One process's three independent intervals, in seconds (DESIGN L5)."""

    liveness_interval: float = LIVENESS_INTERVAL_DEFAULT
    heartbeat_interval: float = HEARTBEAT_INTERVAL_DEFAULT
    poll_interval: float = POLL_INTERVAL_DEFAULT

    def validate(self) -> None:
        """Raises SettingsError naming every interval that is not a positive,
        finite number of seconds."""
        errs: List[ValueError] = []
        for name in ("liveness_interval", "heartbeat_interval", "poll_interval"):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            if not ok:
                errs.append(ValueError(f"Settings.{name}: {INTERVAL_RULE}, got {v!r}"))
        if errs:
            raise SettingsError(errs)


def env_prefix(kind: str) -> str:
    """``"VIGIL_<KIND>_"`` for kind: upper-cased, ``-`` and ``.`` turned into ``_``.

    >>> env_prefix("fork-resolution")
    'VIGIL_FORK_RESOLUTION_'
    """
    return "VIGIL_" + kind.upper().replace("-", "_").replace(".", "_") + "_"


def settings_from_env(kind: str, environ: Optional[Mapping[str, str]] = None) -> Settings:
    """Reads kind's settings from ``VIGIL_<KIND>_{LIVENESS,HEARTBEAT,POLL}_INTERVAL``
    in environ (default ``os.environ``). Raises SettingsError naming every
    bad variable."""
    if not kind:
        raise SettingsError([ValueError("kind: required to name the VIGIL_<KIND>_* settings")])
    env = os.environ if environ is None else environ
    prefix = env_prefix(kind)
    errs: List[ValueError] = []

    def read(suffix: str, default: float) -> float:
        name = prefix + suffix
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            return parse_interval(raw)
        except ValueError:
            errs.append(EnvError(name, raw, INTERVAL_RULE))
            return default

    s = Settings(
        liveness_interval=read(ENV_LIVENESS_SUFFIX, LIVENESS_INTERVAL_DEFAULT),
        heartbeat_interval=read(ENV_HEARTBEAT_SUFFIX, HEARTBEAT_INTERVAL_DEFAULT),
        poll_interval=read(ENV_POLL_SUFFIX, POLL_INTERVAL_DEFAULT),
    )
    if errs:
        raise SettingsError(errs)
    return s


def connection_from_env(
    environ: Optional[Mapping[str, str]] = None,
    read_file: Optional[Callable[[str], str]] = None,
) -> Tuple[List[str], Optional[str]]:
    """The server URLs from ``VIGIL_URL`` (comma-separated, default
    URL_DEFAULT) and the server token read from the file named by
    ``VIGIL_TOKEN_FILE`` (None when unset): its first token, the file
    holding one a line with blank lines and # comments skipped (a server's
    token file, the newest token first while rotating). Raises
    SettingsError."""
    env = os.environ if environ is None else environ
    urls = [u.strip() for u in env.get(ENV_URL, "").split(",") if u.strip()]
    if not urls:
        urls = [URL_DEFAULT]
    token: Optional[str] = None
    path = env.get(ENV_TOKEN_FILE)
    if path is not None and path.strip():
        reader = read_file or _read_text
        try:
            token = _first_token(reader(path.strip()))
        except OSError as e:
            raise SettingsError([EnvError(ENV_TOKEN_FILE, path, f"read the server token: {e}")]) from e
        if not token:
            raise SettingsError([EnvError(ENV_TOKEN_FILE, path, "the file must hold the server token")])
    return urls, token


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# --- interval parsing, as Go's vigilclient.ParseInterval --------------------

_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_HEX_RE = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+\Z")
_SPECIAL_RE = re.compile(r"[+-]?(?:inf|infinity|nan)\Z", re.IGNORECASE)

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # µ (micro sign)
    "\u03bcs": 1_000,  # μ (Greek mu)
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}


def parse_interval(s: str) -> float:
    """Parses an interval setting into seconds: a Go duration (``"30s"``,
    ``"1m30s"``, ``"500ms"``) or a plain number of seconds (``"30"``,
    ``"0.5"``). It must be positive and finite, at nanosecond resolution;
    otherwise ValueError ``"<value>": must be a positive duration like 30s``.
    """
    return parse_interval_ns(s) / 1e9


def parse_interval_ns(s: str) -> int:
    """parse_interval in whole nanoseconds, as Go's time.Duration holds it."""
    t = s.strip()
    bad = ValueError(f"{go_quote(t)}: {INTERVAL_RULE}")
    f: Optional[float] = None
    if _DECIMAL_RE.match(t):
        f = float(t)
    elif _HEX_RE.match(t):
        f = float.fromhex(t)
    elif _SPECIAL_RE.match(t):
        raise bad
    if f is not None:
        ns = f * 1e9
        if math.isnan(f) or math.isinf(f) or ns <= 0 or ns >= _MAX_NS:
            raise bad
        d = int(ns)  # truncated toward zero, as time.Duration(ns)
    else:
        try:
            d = parse_go_duration(t)
        except ValueError:
            raise bad from None
    if d <= 0:
        raise bad
    return d


def parse_go_duration(s: str) -> int:
    """Go's time.ParseDuration: nanoseconds of a string like ``"1h2m3.5s"``,
    ``"-1.5h"`` or ``"300ms"`` (units ns, us, µs, μs, ms, s, m, h)."""
    orig = s
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if s == "":
        raise ValueError(f"time: invalid duration {go_quote(orig)}")
    total = 0
    while s:
        if not (s[0] == "." or "0" <= s[0] <= "9"):
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
        i = 0
        while i < len(s) and "0" <= s[i] <= "9":
            i += 1
        pre = i > 0
        v = int(s[:i]) if pre else 0
        if v > 1 << 63:
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
        s = s[i:]
        frac, scale, post = 0, 1, False
        if s.startswith("."):
            s = s[1:]
            i, overflow = 0, False
            while i < len(s) and "0" <= s[i] <= "9":
                # Digits past int64 precision are ignored, as Go does.
                if not overflow:
                    y = frac * 10 + (ord(s[i]) - 48)
                    if frac > (1 << 63) // 10 or y > 1 << 63:
                        overflow = True
                    else:
                        frac, scale = y, scale * 10
                i += 1
            post = i > 0
            s = s[i:]
        if not pre and not post:
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
        i = 0
        while i < len(s) and s[i] != "." and not ("0" <= s[i] <= "9"):
            i += 1
        unit_name = s[:i]
        s = s[i:]
        if unit_name == "":
            raise ValueError(f"time: missing unit in duration {go_quote(orig)}")
        unit = _UNITS.get(unit_name)
        if unit is None:
            raise ValueError(f"time: unknown unit {go_quote(unit_name)} in duration {go_quote(orig)}")
        if v > (1 << 63) // unit:
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
        v *= unit
        if frac:
            v += int(frac * (unit / scale))
        total += v
        if total > _MAX_NS + (1 if neg else 0):
            raise ValueError(f"time: invalid duration {go_quote(orig)}")
    return -total if neg else total


def go_quote(s: str) -> str:
    """Quotes s as Go's strconv.Quote (``%q``) does, so messages match the Go SDK's."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif 0xDC80 <= o <= 0xDCFF:  # a raw byte kept by surrogateescape
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _first_token(text: str) -> str:
    """The first line of a token file that is neither blank nor a # comment,
    stripped; "" when there is none."""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    return ""
