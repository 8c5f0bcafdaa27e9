"""The program of one JavaScript context: a persistent Node.js, driven over the same pipes
as `shell.py` (a JSON request per line in, a JSON event per line out).

The guest runs `SOURCE` with the desktop's `node -e SOURCE REQ EVT`. Each run's code is
a script run in Node's global context (`vm.runInThisContext`), so `var`, `let`, `const`,
functions and `require`d modules stay for the next run. The script's completion value is
the main result (`util.inspect`'s text; a promise is awaited first, so
`fetch(url).then(r => r.status)` gives the status). `console.*` and `process.stdout`/
`process.stderr` writes become `stream` events in order with the result; an exception is
an `error` event with its name, message and stack. SIGINT (the guest's interrupt or
timeout) stops a synchronous loop (`breakOnSigint`) or abandons the promise being
awaited; between runs it is ignored. Top-level `await` is not supported (a SyntaxError
says so): end the script with a promise instead.
"""

SOURCE = r"""
'use strict';
const fs = require('fs');
const net = require('net');
const readline = require('readline');
const util = require('util');
const vm = require('vm');

const [requestsFd, eventsFd] = process.argv.slice(1).map(Number);

function send(event) {
  const line = Buffer.from(JSON.stringify(event) + '\n');
  let written = 0;
  while (written < line.length) written += fs.writeSync(eventsFd, line, written);
}

function stream(name) {
  return (chunk, encoding, callback) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    if (text) send({kind: 'stream', name, text});
    if (typeof encoding === 'function') encoding();
    else if (typeof callback === 'function') callback();
    return true;
  };
}
process.stdout.write = stream('stdout');
process.stderr.write = stream('stderr');
const out = new console.Console({stdout: process.stdout, stderr: process.stderr});
for (const method of Object.keys(console)) {
  if (typeof out[method] === 'function') console[method] = out[method].bind(out);
}

let interrupt = null;
process.on('SIGINT', () => { if (interrupt) interrupt(); });

function errorEvent(error) {
  if (error instanceof Error || (error && typeof error === 'object' && 'message' in error)) {
    const name = /interrupted by `SIGINT`/.test(String(error.message))
      ? 'KeyboardInterrupt' : String(error.name || 'Error');
    const stack = String(error.stack || '');
    return {kind: 'error', name, value: String(error.message), traceback: stack};
  }
  return {kind: 'error', name: 'Error', value: util.inspect(error), traceback: ''};
}

let runs = 0;
async function run(request) {
  runs += 1;
  send({kind: 'count', n: runs});
  const saved = {};
  for (const [name, value] of Object.entries(request.env || {})) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  try {
    let value = vm.runInThisContext(request.code, {
      filename: `run-${runs}.js`, breakOnSigint: true, displayErrors: false,
    });
    if (value && typeof value.then === 'function') {
      const stopped = new Promise((_, reject) => {
        const stop = new Error('the run was interrupted');
        stop.name = 'KeyboardInterrupt';
        interrupt = () => reject(stop);
      });
      value = await Promise.race([value, stopped]);
    }
    if (value !== undefined) {
      send({kind: 'result', main: true, data: {'text/plain': util.inspect(value)}});
    }
  } catch (error) {
    send(errorEvent(error));
  } finally {
    interrupt = null;
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name]; else process.env[name] = value;
    }
    send({kind: 'done', run: request.run});
  }
}

async function main() {
  // A socket, not fs.createReadStream: a blocking read in libuv's thread pool would keep
  // process.exit() from ending the process.
  const input = new net.Socket({fd: requestsFd, readable: true, writable: false});
  const requests = readline.createInterface({input});
  send({kind: 'ready'});
  for await (const line of requests) await run(JSON.parse(line));
  process.exit(0);
}
main();
"""
