// An edge node with two devices on Eclipse Tahu's Sparkplug B client
// (sparkplug-client, as Sparkplug users run it), for edgegate's
// TestSparkplugTahuInterop. The test drives it through stdin, one command
// a line, and it answers on stdout, one JSON object a line:
//
//   {"reading": {"device", "metric", "t" (ms), "v"}}  a value it published
//       that the gateway is to aggregate (its own record: the test computes
//       the expected summaries from these alone)
//   {"dead": "..."}                                  a value it published
//       that the gateway is to dead-letter
//   {"ready": "<command>", "publications": n}        the command is done;
//       n Sparkplug publications so far
//
// Commands:
//   session1  connect, NBIRTH and two DBIRTHs, data by alias
//   offline   lose the connection (the broker sends the NDEATH will)
//   session2  connect again; births; the data stored while offline as
//             historical DDATA in order; live data; more stored data
//             interleaved; a metric by an alias never born, then wait for
//             the host's rebirth request and answer it with new births
//   stop      disconnect and exit
//
// Usage: node edge.js mqtt://127.0.0.1:1883 <group> <edge node> <base ms>
"use strict";
const readline = require("readline");
const sparkplug = require("sparkplug-client");

const [url, group, node, baseArg] = process.argv.slice(2);
const base = Number(baseArg); // a minute boundary, in ms
let client = null;
let publications = 0;

function out(o) { process.stdout.write(JSON.stringify(o) + "\n"); }
function at(s) { return base + s * 1000; }

// A metric by alias, as DATA sends it. Tahu's encoder needs the type.
function metric(alias, type, v, t, historical) {
  const m = { alias: alias, type: type, value: v, timestamp: t };
  if (historical) m.isHistorical = true;
  return m;
}

// Each device's metrics: name, alias, type. Aggregated: every numeric type.
const node_metrics = [["Supply/Voltage", 1, "Double"]];
const devices = {
  pump: [["Motor/rpm", 2, "Int32"], ["flow", 3, "Float"], ["running", 4, "Boolean"]],
  valve: [["position", 5, "UInt16"], ["delta", 6, "Int8"], ["Properties/Firmware", 7, "String"]],
};
const numeric = new Set(["Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double"]);

function deviceName(dev) { return dev ? group + "/" + node + "/" + dev : group + "/" + node; }

// record notes a value published as a reading the gateway aggregates.
function record(dev, name, type, v, t) {
  if (numeric.has(type) && v !== null) out({ reading: { device: deviceName(dev), metric: name, t: t, v: v } });
}

function birthMetrics(dev, list, t, values) {
  return list.map(([name, alias, type], i) => {
    const v = values ? values[i] : null;
    record(dev, name, type, v, t);
    return { name: name, alias: alias, type: type, value: v, timestamp: t };
  });
}

function births(t, values) {
  client.publishNodeBirth({ timestamp: t, metrics: [
    { name: "Node Control/Rebirth", type: "Boolean", value: false },
    ...birthMetrics("", node_metrics, t, values.node)] });
  client.publishDeviceBirth("pump", { timestamp: t, metrics: birthMetrics("pump", devices.pump, t, values.pump) });
  client.publishDeviceBirth("valve", { timestamp: t, metrics: birthMetrics("valve", devices.valve, t, values.valve) });
  publications += 3;
}

// ddata publishes one DDATA (or NDATA for dev "") of [alias, value] pairs
// at time t and records its readings.
function ddata(dev, t, pairs, historical) {
  const list = dev ? devices[dev] : node_metrics;
  const ms = pairs.map(([alias, v]) => {
    const [name, , type] = list.find(m => m[1] === alias);
    record(dev, name, type, v, t);
    return metric(alias, type, v, t, historical);
  });
  if (dev) client.publishDeviceData(dev, { timestamp: t, metrics: ms });
  else client.publishNodeData({ timestamp: t, metrics: ms });
  publications++;
}

function connect(onBirth) {
  client = sparkplug.newClient({
    serverUrl: url, clientId: node, username: null, password: null, groupId: group, edgeNode: node,
    publishDeath: true, version: "spBv1.0", mqttOptions: { reconnectPeriod: 0 },
  });
  client.on("error", e => { console.error("mqtt error", e); process.exit(2); });
  client.once("birth", onBirth);
}

// ready says a command is done; the test then waits until the gateway has
// applied that many publications (one connection delivers them in order).
function ready(cmd) { out({ ready: cmd, publications: publications }); }

const commands = {
  session1() {
    connect(() => {
      births(at(0), { node: [230.5], pump: [1000, 1.5, true], valve: [10, -3, "1.2.0"] });
      for (let s = 10; s < 60; s += 10) {
        ddata("pump", at(s), [[2, 1000 + s], [3, 1.5 + s / 4]]);
        ddata("valve", at(s), [[5, 10 + s], [6, -s]]);
      }
      ddata("", at(30), [[1, 231.25]]);
      ready("session1");
    });
  },
  offline() {
    // The network goes: no DISCONNECT, so the broker sends the will.
    client.client.stream.destroy();
    client.client.end(true);
    ready("offline");
  },
  session2() {
    connect(() => {
      // The pump's values are those it stored; its birth has none yet.
      births(at(175), { node: [229], pump: [null, null, null], valve: [40, 5, "1.2.0"] });
      // Stored while offline, replayed in order: windows close by the
      // pump's own watermark.
      for (let s = 60; s < 180; s += 10) ddata("pump", at(s), [[2, 2000 - s], [3, s / 8]], true);
      // Live data, then more stored data from before it: revisions.
      for (let s = 180; s < 240; s += 15) ddata("pump", at(s), [[2, 3000 + s]]);
      ddata("pump", at(125), [[2, -7], [3, 0.125]], true);
      ddata("pump", at(65), [[3, 64]], true);
      // A metric the births never defined: the gateway dead-letters it and
      // asks for a rebirth.
      client.publishDeviceData("valve", { timestamp: at(241), metrics: [metric(99, "Double", 7, at(241))] });
      publications++;
      out({ dead: "alias 99" });
      client.on("ncmd", p => {
        const rebirth = (p.metrics || []).find(m => m.name === "Node Control/Rebirth");
        if (!rebirth || rebirth.value !== true) return;
        births(at(250), { node: [228.75], pump: [3250, 2.75, false], valve: [41, 6, "1.2.0"] });
        ddata("valve", at(255), [[5, 42], [6, -128]]);
        ddata("pump", at(256), [[2, -2147483648], [3, 3.5]]);
        ready("session2");
      });
    });
  },
  stop() {
    client.stop(); // publishes the NDEATH, then disconnects
    publications++;
    ready("stop");
    setTimeout(() => process.exit(0), 200);
  },
};

readline.createInterface({ input: process.stdin }).on("line", line => {
  const cmd = commands[line.trim()];
  if (!cmd) { console.error("unknown command " + line); process.exit(2); }
  cmd();
});
