#!/bin/sh
# agent.sh: a vigil agent in plain POSIX sh and curl, to show the HTTP API
# (docs/api.md) from any language. It
#
#   1. registers a process instance of kind "shell" (POST /v1/processes),
#   2. sends a liveness heartbeat every 10s from a background loop,
#   3. claims "echo" tasks and completes each with {"echo": <payload text>},
#   4. on TERM or INT releases a task it holds and records its exit, so the
#      instance shows stopped at once.
#
# Try it:  vigil serve &
#          sh examples/shell-agent/agent.sh &
#          curl -s -X POST localhost:7711/v1/tasks -H 'Content-Type: application/json' -d '{"task_type":"echo","payload":{"text":"hi"}}'
#
# jq is not needed: json_get reads a field out of an answer with a small awk
# JSON scanner (escapes and \uXXXX decoded), and json_escape escapes text put
# into a request. Echo tasks are short, so this agent sends no lease
# heartbeats; a long task would also POST /v1/tasks/ID/heartbeat every
# VIGIL_SHELL_HEARTBEAT_INTERVAL while it runs. A complete the server refuses
# (4xx other than 409) is followed by fail, so the task does not stay running
# until its lease expires.
#
# Environment:
#   VIGIL_URL                      server; the first of a comma-separated list (default http://127.0.0.1:7711)
#   VIGIL_TOKEN_FILE               file with the server token, if the server has one
#   VIGIL_SHELL_LIVENESS_INTERVAL  seconds between liveness heartbeats (default 10)
#   VIGIL_SHELL_POLL_INTERVAL      seconds between claims while idle (default 5)

set -u

V=${VIGIL_URL:-http://127.0.0.1:7711}
V=${V%%,*}
LIVENESS=${VIGIL_SHELL_LIVENESS_INTERVAL:-10}
POLL=${VIGIL_SHELL_POLL_INTERVAL:-5}
AUTH=
if [ -n "${VIGIL_TOKEN_FILE:-}" ]; then
	AUTH="Authorization: Bearer $(cat "$VIGIL_TOKEN_FILE")"
fi
NL='
'

log() {
	printf '%s agent.sh[%s]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$$" "$*" >&2
}

# api METHOD PATH [JSON]: one API call. Sets BODY (without its trailing
# newline) and STATUS (000 when the server could not be reached). Sends the
# instance token once we have one. The JSON goes through stdin, not argv,
# which could not hold a large result.
api() {
	out=$(printf '%s' "${3-}" | curl -sS -X "$1" "$V$2" \
		-H 'Content-Type: application/json' \
		${AUTH:+-H "$AUTH"} \
		${TOKEN:+-H "X-Vigil-Instance-Token: $TOKEN"} \
		${3:+--data-binary @-} \
		-w "$NL%{http_code}") || out="${NL}000"
	STATUS=${out##*"$NL"}
	BODY=${out%"$NL"*}
	while [ "${BODY%"$NL"}" != "$BODY" ]; do
		BODY=${BODY%"$NL"}
	done
}

# json_get KEY...: the value in BODY at the path of object keys KEY... (e.g.
# "payload text"), printed without a trailing newline: a string decoded
# (\" \\ \n \uXXXX and the rest; \u0000, which sh cannot hold, dropped), a
# number, true, false or null as written; nothing when there is no such
# field or it holds an object or array. A whole-JSON scanner, so a key or
# escaped quote inside a string is never taken for structure. To keep
# trailing newlines of a string: V=$(json_get KEY; echo .); V=${V%.}
json_get() {
	printf '%s\n' "$BODY" | LC_ALL=C awk '
	BEGIN {
		for (i = 1; i < ARGC; i++) {
			want = want SUBSEP ARGV[i]
			delete ARGV[i]
		}
		unesc["\""] = "\""; unesc["\\"] = "\\"; unesc["/"] = "/"
		unesc["b"] = "\b"; unesc["f"] = "\f"; unesc["n"] = "\n"; unesc["r"] = "\r"; unesc["t"] = "\t"
	}
	{ s = NR > 1 ? s "\n" $0 : $0 }
	END { n = length(s); P = 1; value("") }

	function ws() {
		while (P <= n && index(" \t\n\r", substr(s, P, 1)))
			P++
	}
	function bad() { P = n + 1 }
	# value(path): scan the value at P; print it and stop if path is wanted.
	function value(path,    c, k, start) {
		ws()
		c = substr(s, P, 1)
		if (c == "{" || c == "[") {
			P++
			ws()
			if (substr(s, P, 1) == (c == "{" ? "}" : "]")) {
				P++
				return
			}
			while (P <= n) {
				if (c == "{") {
					ws()
					if (substr(s, P, 1) != "\"") return bad()
					k = str(1)
					ws()
					if (substr(s, P, 1) != ":") return bad()
					P++
					value(path SUBSEP k)
				} else
					value("[]") # no key path leads into an array
				ws()
				k = substr(s, P, 1)
				P++
				if (k == (c == "{" ? "}" : "]")) return
				if (k != ",") return bad()
			}
		} else if (c == "\"") {
			if (path != want) {
				str(0)
				return
			}
			str(2)
			exit
		} else {
			start = P
			while (P <= n && index("+-.0123456789Eaeflnrstu", substr(s, P, 1)))
				P++
			if (P == start) return bad()
			if (path == want) {
				printf "%s", substr(s, start, P - start)
				exit
			}
		}
	}
	# str(mode): scan the string at P, decoding it; mode 0 skips it, 1
	# returns it, 2 prints it (a long string is never built up in memory).
	function str(mode,    start, c, e, u, u2, at) {
		buf = ""
		start = ++P
		while (P <= n) {
			c = substr(s, P, 1)
			if (c != "\"" && c != "\\") {
				P++
				continue
			}
			put(mode, substr(s, start, P - start))
			if (c == "\"") {
				P++
				return buf
			}
			e = substr(s, P + 1, 1)
			P += 2
			if (e == "u") {
				u = hex4()
				if (u < 0) return bad()
				if (u >= 55296 && u < 56320 && substr(s, P, 2) == "\\u") {
					at = P
					P += 2
					u2 = hex4()
					if (u2 >= 56320 && u2 < 57344)
						u = 65536 + (u - 55296) * 1024 + (u2 - 56320)
					else
						P = at
				}
				put(mode, utf8(u))
			} else if (e in unesc)
				put(mode, unesc[e])
			else
				return bad()
			start = P
		}
	}
	function put(mode, x) {
		if (mode == 2)
			printf "%s", x
		else if (mode == 1)
			buf = buf x
	}
	function hex4(    i, d, v) {
		for (i = 0; i < 4; i++) {
			d = index("0123456789abcdef", tolower(substr(s, P + i, 1)))
			if (!d) return -1
			v = v * 16 + d - 1
		}
		P += 4
		return v
	}
	function utf8(u) {
		if (u == 0) return ""
		if (u < 128) return sprintf("%c", u)
		if (u < 2048) return sprintf("%c%c", 192 + int(u / 64), 128 + u % 64)
		if (u >= 55296 && u < 57344) u = 65533 # a lone surrogate: U+FFFD
		if (u < 65536) return sprintf("%c%c%c", 224 + int(u / 4096), 128 + int(u / 64) % 64, 128 + u % 64)
		return sprintf("%c%c%c%c", 240 + int(u / 262144), 128 + int(u / 4096) % 64, 128 + int(u / 64) % 64, 128 + u % 64)
	}
	' "$@"
}

# json_escape TEXT: TEXT as the inside of a JSON string, printed without a
# trailing newline: backslash, double quote and control characters escaped.
json_escape() {
	printf '%s\n' "$1" | LC_ALL=C awk '
	BEGIN {
		for (i = 1; i < 32; i++)
			esc[sprintf("%c", i)] = sprintf("\\u%04x", i)
		esc["\\"] = "\\\\"; esc["\""] = "\\\""
		esc["\b"] = "\\b"; esc["\f"] = "\\f"; esc["\r"] = "\\r"; esc["\t"] = "\\t"
	}
	{
		if (NR > 1)
			printf "\\n" # the newline that ended the line before
		start = 1
		n = length($0)
		for (i = 1; i <= n; i++)
			if ((c = substr($0, i, 1)) in esc) {
				printf "%s%s", substr($0, start, i - start), esc[c]
				start = i + 1
			}
		printf "%s", substr($0, start)
	}'
}

# 1. Register. The answer carries our instance_id and the instance token
#    that every later write on our behalf must send.
TOKEN=
api POST /v1/processes \
	"{\"process_kind\":\"shell\",\"hostname\":\"$(json_escape "$(uname -n)")\",\"pid\":$$,\"liveness_interval_s\":$LIVENESS}"
if [ "$STATUS" != 201 ]; then
	log "register failed: HTTP $STATUS $BODY"
	exit 1
fi
ID=$(json_get instance_id)
TOKEN=$(json_get instance_token)
log "registered instance $ID"

# 2. Liveness: a background loop, whatever the main loop is doing. It stops
#    by itself if this shell dies without running its trap (kill -9).
(
	while sleep "$LIVENESS" && kill -0 "$$" 2>/dev/null; do
		api POST "/v1/processes/$ID/heartbeat"
		[ "$STATUS" = 200 ] || log "liveness heartbeat failed: HTTP $STATUS $BODY"
	done
) &
HEARTBEAT_PID=$!

# 4. Stop: release the task we hold (if any), record the exit.
TASK_ID=
EPOCH=
SLEEP_PID=
shutdown() {
	trap '' TERM INT
	kill "$HEARTBEAT_PID" $SLEEP_PID 2>/dev/null
	if [ -n "$TASK_ID" ]; then
		api POST "/v1/tasks/$TASK_ID/release" "{\"instance_id\":\"$ID\",\"lease_epoch\":$EPOCH}"
		log "released task $TASK_ID: HTTP $STATUS"
	fi
	api POST "/v1/processes/$ID/exit"
	log "exited: HTTP $STATUS"
	exit 0
}
trap shutdown TERM INT

# 3. Claim, work, complete; wait POLL seconds when there is nothing to do.
while :; do
	api POST /v1/tasks/claim "{\"instance_id\":\"$ID\",\"task_types\":[\"echo\"]}"
	case $STATUS in
	200)
		TASK_ID=$(json_get task_id)
		EPOCH=$(json_get lease_epoch)
		TEXT=$(json_get payload text; echo .) # the dot keeps trailing newlines
		TEXT=${TEXT%.}
		log "claimed task $TASK_ID at epoch $EPOCH"
		api POST "/v1/tasks/$TASK_ID/complete" \
			"{\"instance_id\":\"$ID\",\"lease_epoch\":$EPOCH,\"result\":{\"echo\":\"$(json_escape "$TEXT")\",\"pid\":$$}}"
		case $STATUS in
		200) log "completed task $TASK_ID" ;;
		409) log "complete refused: lease lost (stale epoch): $BODY" ;;
		4??)
			# Refused for good: fail the task rather than leave it running
			# until its lease expires. fail retries it after a backoff, or
			# dead-letters it at max_attempts.
			ERR="complete refused: HTTP $STATUS $(json_get error code): $(json_get error message)"
			log "$ERR"
			api POST "/v1/tasks/$TASK_ID/fail" \
				"{\"instance_id\":\"$ID\",\"lease_epoch\":$EPOCH,\"error\":\"$(json_escape "$ERR")\"}"
			case $STATUS in
			200) log "failed task $TASK_ID" ;;
			*) log "fail failed: HTTP $STATUS $BODY" ;;
			esac
			;;
		*) log "complete failed: HTTP $STATUS $BODY" ;;
		esac
		TASK_ID=
		continue
		;;
	204) ;;
	*) log "claim failed: HTTP $STATUS $BODY" ;;
	esac
	# In the background so that TERM/INT runs the trap at once.
	sleep "$POLL" &
	SLEEP_PID=$!
	wait "$SLEEP_PID"
	SLEEP_PID=
done
