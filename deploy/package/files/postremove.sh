#!/bin/sh
# meshfold package postremove: systemd forgets the removed units. The
# meshfold user and /var/lib/meshfold are kept (the stream lives there).
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
