// A JavaScript code context for Lizard's code service (code_server.py): one Node.js process
// whose global scope persists between cells. Cells come as JSON lines on stdin
// ({code, envs, timeoutMs}); the cell's own output goes to this process's stdout and stderr
// (read by the service as it comes); results, errors and the end of each cell are JSON lines
// on the private pipe LIZARD_EVENTS_FD, so nothing a cell prints can forge them.
// With `--typescript`, each cell's types are stripped first (Node.js's own stripper: the
// code keeps its positions, so errors point at the cell's own lines).
'use strict'
const fs = require('fs')
const readline = require('readline')
const util = require('util')
const vm = require('vm')

const typescript = process.argv.includes('--typescript')
const filename = typescript ? 'cell.ts' : 'cell.js'
const source = typescript ? (code) => require('module').stripTypeScriptTypes(code, { mode: 'strip' }) : (code) => code

const eventsFd = Number(process.env.LIZARD_EVENTS_FD)
delete process.env.LIZARD_EVENTS_FD
// Every event carries its cell's nonce: the service ignores lines without it, which is
// all a cell could write to the pipe itself.
const send = (nonce, event) => fs.writeSync(eventsFd, JSON.stringify({ ...event, cell: nonce }) + '\n')

// Cells see what a Node.js module sees.
globalThis.require = require
globalThis.module = module
globalThis.exports = exports

// Background work of an earlier cell must not end the context.
process.on('uncaughtException', (e) => process.stderr.write(`Uncaught ${util.inspect(e)}\n`))
process.on('unhandledRejection', (e) => process.stderr.write(`Unhandled rejection: ${util.inspect(e)}\n`))

function errorEvent (e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    return { type: 'error', name: String(e.name || 'Error'), value: String(e.message ?? ''), traceback: String(e.stack || '') }
  }
  return { type: 'error', name: 'Error', value: util.inspect(e), traceback: '' }
}

function resultEvent (value) {
  const data = { 'text/plain': util.inspect(value, { depth: 4, colors: false }) }
  return { type: 'result', data, isMainResult: true }
}

// A cell with top-level `await` cannot be a script: it runs as an async function body,
// whose declarations stay local and whose last expression is not shown.
function compile (cell) {
  const code = source(cell)
  try {
    return { script: new vm.Script(code, { filename }), wrapped: false }
  } catch (e) {
    if (e instanceof SyntaxError && /await/.test(e.message)) {
      return { script: new vm.Script(`(async () => {\n${code}\n})()`, { filename }), wrapped: true }
    }
    throw e
  }
}

// What stops the awaited part of the running cell when the service interrupts it (SIGINT:
// its caller went away, or its timeout passed); the synchronous part stops through the
// vm's `breakOnSigint`.
let interruptCell = () => {}

async function runCell ({ code, envs, timeoutMs, nonce }) {
  const saved = {}
  for (const [k, v] of Object.entries(envs || {})) {
    saved[k] = process.env[k]
    process.env[k] = v
  }
  try {
    const { script, wrapped } = compile(code)
    let value = script.runInThisContext({ timeout: timeoutMs, displayErrors: false, breakOnSigint: true })
    if (value && typeof value.then === 'function') {
      let timer
      const expired = new Promise((resolve, reject) => {
        timer = setTimeout(() => reject(Object.assign(new Error(`execution exceeded its timeout of ${timeoutMs} ms`), { name: 'TimeoutError' })), timeoutMs)
        interruptCell = () => reject(Object.assign(new Error('the execution was interrupted'), { name: 'InterruptedError' }))
      })
      try {
        value = await Promise.race([value, expired])
      } finally {
        clearTimeout(timer)
        interruptCell = () => {}
      }
    }
    if (value !== undefined && !wrapped) send(nonce, resultEvent(value))
  } catch (e) {
    if (e && e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') {
      send(nonce, { type: 'error', name: 'TimeoutError', value: `execution exceeded its timeout of ${timeoutMs} ms; the context was interrupted`, traceback: '' })
    } else {
      send(nonce, errorEvent(e))
    }
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
  }
  send(nonce, { type: 'done' })
}

// One cell at a time, in order.
let chain = Promise.resolve()
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const cell = JSON.parse(line)
  chain = chain.then(() => runCell(cell))
}).on('close', () => process.exit(0))
// SIGINT from the service: a cell awaiting something stops waiting (the context lives on).
process.on('SIGINT', () => interruptCell())
