// MQTT.js (npm mqtt 5.x) publishing QoS 1 readings for TestClientMatrix:
// a persistent session (clean: false; MQTT 5 with a session expiry), its
// defaults otherwise (reconnect every second, in-memory store, offline
// queue), the readings published in bursts.
//
//   node mqttjs_pub.js HOST PORT CLIENT_ID COUNT PROTOCOL_VERSION BURST
//
// On reconnecting, MQTT.js resends its outgoing store one publication at a
// time (the next once the last is acknowledged), with the packet ids they
// had and without DUP; publications made while offline follow.
//
// Prints a JSON line {"sent", "acked", "errors", "disconnects"} every
// 200 ms and a last one with "done": true once every reading is
// acknowledged (or on SIGTERM); exits 0 when all were.
'use strict'
const mqtt = require('mqtt')

const [host, port, clientId, countArg, versionArg, burstArg] = process.argv.slice(2)
const count = Number(countArg)
const version = Number(versionArg)
const burst = Number(burstArg)
const opts = { clientId, clean: false, protocolVersion: version, keepalive: 30 }
if (version === 5) opts.properties = { sessionExpiryInterval: 3600 }
const c = mqtt.connect(`mqtt://${host}:${port}`, opts)

let sent = 0
let acked = 0
let errors = 0
let disconnects = 0
c.on('close', () => { disconnects++ })
c.on('error', () => {})

const topic = `sensors/${clientId}/m`
function publishBurst () {
  for (let i = 0; i < burst && sent < count; i++) {
    sent++
    c.publish(topic, '1', { qos: 1 }, (err) => { if (err) errors++; else acked++ })
  }
  if (sent < count) setTimeout(publishBurst, 50)
}
publishBurst()

function report (done) {
  const line = { sent, acked, errors, disconnects }
  if (done) line.done = true
  process.stdout.write(JSON.stringify(line) + '\n')
}
function finish () {
  report(true)
  c.end(true, () => process.exit(acked === count ? 0 : 1))
  setTimeout(() => process.exit(acked === count ? 0 : 1), 1000)
}
const timer = setInterval(() => {
  report(false)
  if (acked >= count) { clearInterval(timer); finish() }
}, 200)
process.on('SIGTERM', () => { clearInterval(timer); finish() })
