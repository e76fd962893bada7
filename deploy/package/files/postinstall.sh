#!/bin/sh
# meshfold package postinstall: the system user serve, reconcile@ and the
# console run as, then systemd learns the new units. Idempotent (an upgrade
# runs it again).
set -e
if ! getent group meshfold >/dev/null 2>&1; then
	groupadd --system meshfold
fi
if ! getent passwd meshfold >/dev/null 2>&1; then
	useradd --system --gid meshfold --home-dir /var/lib/meshfold --no-create-home \
		--shell /usr/sbin/nologin --comment "meshfold serve" meshfold
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
