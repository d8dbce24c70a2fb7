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
#          curl -s -X POST localhost:7711/v1/tasks -d '{"task_type":"echo","payload":{"text":"hi"}}'
#
# jq is not needed: answers are parsed with sed, which is enough for the
# flat fields read here (no escaped quotes inside them). A real agent should
# use a JSON parser. Echo tasks are short, so this agent sends no lease
# heartbeats; a long task would also POST /v1/tasks/ID/heartbeat every
# VIGIL_SHELL_HEARTBEAT_INTERVAL while it runs.
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

# api METHOD PATH [JSON]: one API call. Sets BODY and STATUS (000 when the
# server could not be reached). Sends the instance token once we have one.
api() {
	out=$(curl -sS -X "$1" "$V$2" \
		-H 'Content-Type: application/json' \
		${AUTH:+-H "$AUTH"} \
		${TOKEN:+-H "X-Vigil-Instance-Token: $TOKEN"} \
		${3:+-d "$3"} \
		-w "$NL%{http_code}") || out="${NL}000"
	STATUS=${out##*"$NL"}
	BODY=${out%"$NL"*}
}

# json_str KEY / json_num KEY: the value of "KEY" in BODY.
json_str() {
	printf '%s\n' "$BODY" | sed -n 's/.*"'"$1"'"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' | head -n 1
}
json_num() {
	printf '%s\n' "$BODY" | sed -n 's/.*"'"$1"'"[[:space:]]*:[[:space:]]*\(-\{0,1\}[0-9][0-9]*\).*/\1/p' | head -n 1
}

# 1. Register. The answer carries our instance_id and the instance token
#    that every later write on our behalf must send.
TOKEN=
api POST /v1/processes \
	"{\"process_kind\":\"shell\",\"hostname\":\"$(uname -n)\",\"pid\":$$,\"liveness_interval_s\":$LIVENESS}"
if [ "$STATUS" != 201 ]; then
	log "register failed: HTTP $STATUS $BODY"
	exit 1
fi
ID=$(json_str instance_id)
TOKEN=$(json_str instance_token)
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
		TASK_ID=$(json_num task_id)
		EPOCH=$(json_num lease_epoch)
		TEXT=$(json_str text)
		log "claimed task $TASK_ID at epoch $EPOCH"
		api POST "/v1/tasks/$TASK_ID/complete" \
			"{\"instance_id\":\"$ID\",\"lease_epoch\":$EPOCH,\"result\":{\"echo\":\"$TEXT\",\"pid\":$$}}"
		case $STATUS in
		200) log "completed task $TASK_ID" ;;
		409) log "complete refused: lease lost (stale epoch): $BODY" ;;
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
