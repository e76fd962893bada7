#!/bin/sh
# rotate-secret.sh: put a new sealed secret to a fleet's nodes one at a time,
# the first as a canary, each only after the one before ran healthy with it.
#
#   rotate-secret.sh -f NEW --by NAME [--rollback OLD] MODULE PATH NODE...
#
# For each NODE in order: `meshfold secret put NODE MODULE PATH -f NEW`, which
# must print "filled on NODE" within PUT_WAIT; then `meshfold state NODE -o json`
# every INTERVAL seconds until MODULE has run, with no restart since the put
# (on_fill restarts are not counted) and its health check healthy (or, without a
# check, running), for MIN_HEALTHY seconds in a row; at most HEALTHY_DEADLINE
# seconds. A node that does not get there stops the rotation (exit 1): with
# --rollback OLD, OLD is put again to that node and to every node rotated before
# it; without, the commands that would do it are printed. The nodes after it
# are not touched.
#
# Connection: meshfold's usual environment ($NATS_URL, $NATS_CREDS: the
# operator's, $NATS_CA, $NATS_CERT, $NATS_KEY). Needs jq.
# Environment (seconds): MIN_HEALTHY (default 60: longer than the module's
# health check takes to fail, failures x interval), HEALTHY_DEADLINE (300),
# INTERVAL (2), PUT_WAIT (10); MESHFOLD (the meshfold command, default meshfold).
set -u

MESHFOLD=${MESHFOLD:-meshfold}
MIN_HEALTHY=${MIN_HEALTHY:-60}
HEALTHY_DEADLINE=${HEALTHY_DEADLINE:-300}
INTERVAL=${INTERVAL:-2}
PUT_WAIT=${PUT_WAIT:-10}

usage() {
	echo "usage: rotate-secret.sh -f NEW --by NAME [--rollback OLD] MODULE PATH NODE..." >&2
	exit 2
}

new= by= old=
while [ $# -gt 0 ]; do
	case $1 in
	-f) new=$2; shift 2 ;;
	--by) by=$2; shift 2 ;;
	--rollback) old=$2; shift 2 ;;
	-*) usage ;;
	*) break ;;
	esac
done
[ -n "$new" ] && [ -n "$by" ] && [ $# -ge 3 ] || usage
module=$1 path=$2
shift 2

# runtime NODE: the module's runtime in NODE's state, as one JSON object
# ("null" when the newest have does not list it).
runtime() {
	"$MESHFOLD" state "$1" -o json | jq -c --arg m "$module" '[.view.runtime[]? | select(.module == $m)][0]'
}

# put NODE FILE: seal FILE to NODE and wait for the fill; 0 when filled.
# put_rc is meshfold's exit code: 0 when the put was stored (filled or
# not), 2 when it was refused and nothing was stored (an empty or
# oversized file, a path the want does not declare), else another failure.
put() {
	out=$("$MESHFOLD" secret put "$1" "$module" "$path" -f "$2" --by "$by" --wait "${PUT_WAIT}s")
	put_rc=$?
	echo "$out"
	[ $put_rc -eq 0 ] || return 1
	case $out in *"filled on $1"*) return 0 ;; esac
	return 1
}

# gate NODE RESTARTS: MODULE on NODE healthy for MIN_HEALTHY seconds in a row
# with no restart beyond RESTARTS, within HEALTHY_DEADLINE; 0 when it was.
gate() {
	start=$(date +%s) since=
	while :; do
		now=$(date +%s)
		rt=$(runtime "$1") || rt=null
		ok=$(echo "$rt" | jq -r --argjson r "$2" \
			'if . == null then "no module"
			 elif .restarts > $r then "restarted (\(.restarts) restarts, \(.exit // "no exit status"))"
			 elif .state != "running" then "state \(.state)"
			 elif (.health // "healthy") != "healthy" then "health \(.health)"
			 else "ok" end')
		if [ "$ok" = ok ]; then
			[ -n "$since" ] || since=$now
			if [ $((now - since)) -ge "$MIN_HEALTHY" ]; then
				echo "  $1: $module healthy for ${MIN_HEALTHY}s"
				return 0
			fi
		else
			since=
			# A restart is final: the new content made the module crash.
			case $ok in restarted*) echo "  $1: $module $ok" >&2; return 1 ;; esac
		fi
		if [ $((now - start)) -ge "$HEALTHY_DEADLINE" ]; then
			echo "  $1: $module not healthy for ${MIN_HEALTHY}s within ${HEALTHY_DEADLINE}s: $ok" >&2
			return 1
		fi
		sleep "$INTERVAL"
	done
}

done_nodes=
for node in "$@"; do
	rt=$(runtime "$node") || { echo "rotate-secret: cannot read $node's state" >&2; exit 1; }
	restarts=$(echo "$rt" | jq -r '.restarts // 0')
	echo "$node: putting $path of $module"
	failed= touched=$node
	if ! put "$node" "$new"; then
		case $put_rc in
		0) echo "  $node: the put was not filled within ${PUT_WAIT}s (see above)" >&2 ;;
		2)
			echo "  $node: the put was refused (exit 2, see above): nothing was stored for $node" >&2
			touched=
			;;
		*) echo "  $node: the put failed (exit $put_rc, see above)" >&2 ;;
		esac
		failed=$node
	elif ! gate "$node" "$restarts"; then
		failed=$node
	fi
	if [ -n "$failed" ]; then
		echo "rotate-secret: stopped at $node; not touched: the nodes after it" >&2
		for n in $done_nodes $touched; do
			if [ -n "$old" ]; then
				echo "rolling back $n" >&2
				put "$n" "$old" >&2 || echo "  $n: the rollback put was not filled: see 'meshfold state $n'" >&2
			else
				echo "  to roll back $n: $MESHFOLD secret put $n $module $path -f OLD --by $by" >&2
				echo "    (or, when the previous content lives in a later --from source: $MESHFOLD secret rm $n $module $path --next-source --by $by)" >&2
			fi
		done
		exit 1
	fi
	done_nodes="$done_nodes $node"
done
echo "rotate-secret: $path of $module rotated on$done_nodes"
