#!/bin/sh
# edgegate post-install: the service user, its groups, and systemd.
set -e
if ! getent group edgegate >/dev/null; then
	addgroup --system edgegate
fi
if ! getent passwd edgegate >/dev/null; then
	adduser --system --ingroup edgegate --home /var/lib/edgegate --no-create-home --shell /usr/sbin/nologin edgegate
fi
if getent group i2c >/dev/null; then
	adduser edgegate i2c >/dev/null 2>&1 || true
fi
install -d -o edgegate -g edgegate -m 0750 /var/lib/edgegate
chgrp edgegate /etc/edgegate/edgegate.yaml && chmod 0640 /etc/edgegate/edgegate.yaml
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
	systemctl enable edgegate.service >/dev/null || true
	# Upgrades restart a running gateway; a first install waits for the
	# operator to set gateway.id and kafka.brokers.
	if systemctl is-active --quiet edgegate.service; then
		systemctl restart edgegate.service || true
	fi
fi
