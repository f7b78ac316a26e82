#!/usr/bin/python3
# Debian's python3-paho-mqtt (1.6) publishing QoS 1 readings for
# TestClientMatrix: a persistent session (clean_session=False), every
# reading published at once (the client holds back all but max_inflight),
# auto-reconnect by loop_start.
#
#   paho_pub.py HOST PORT CLIENT_ID COUNT MAX_INFLIGHT
#
# paho 1.6.1 keeps max_inflight only while connected: every (re)connect
# (the first one too, when readings were published before it) goes through
# _messages_reconnect_reset_out, whose in-flight count is never incremented
# (the line is commented out), so every queued reading is sent at once.
#
# Prints a JSON line {"sent", "acked", "disconnects"} every 200 ms and a
# last one with "done": true once every reading is acknowledged (or on
# SIGTERM); exits 0 when all were.
import json
import signal
import sys
import threading
import time

import paho.mqtt.client as mqtt

host, port, client_id, count, inflight = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
lock = threading.Lock()
acked = set()
acks = 0  # on_publish calls, repeats included
disconnects = 0
sent = 0


def on_publish(client, userdata, mid):
    global acks
    with lock:
        acks += 1
        acked.add(mid)


def on_disconnect(client, userdata, rc):
    global disconnects
    with lock:
        disconnects += 1


c = mqtt.Client(client_id=client_id, clean_session=False, protocol=mqtt.MQTTv311)
c.on_publish = on_publish
c.on_disconnect = on_disconnect
c.max_inflight_messages_set(inflight)
c.max_queued_messages_set(0)  # no limit: the whole backlog is kept
c.reconnect_delay_set(min_delay=1, max_delay=2)
c.connect_async(host, port, keepalive=30)
c.loop_start()

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())


def report(done=False):
    with lock:
        line = {"sent": sent, "acked": len(acked), "acks": acks, "disconnects": disconnects}
    if done:
        line["done"] = True
    print(json.dumps(line), flush=True)
    return line


topic = "sensors/%s/m" % client_id
for i in range(count):
    c.publish(topic, "1", qos=1)
    sent += 1

while not stop.is_set():
    line = report()
    if line["acked"] >= count:
        break
    stop.wait(0.2)
line = report(done=True)
c.loop_stop()
sys.exit(0 if line["acked"] == count else 1)
