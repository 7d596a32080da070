// The pushed directory as the server takes it: its recipe file and its manifest (every path
// with its mode; files with their SHA-256 and size, symlinks with their target).
//
// The walk never follows symlinks (a link is sent as a link, and the server refuses a
// `copy` of one that points outside), leaves out what `.lizardignore` names, and sorts paths
// in byte order, the order the server checks.

import { createHash } from 'node:crypto'
import { createReadStream } from 'node:fs'
import fs from 'node:fs/promises'
import path from 'node:path'
import { ContextError } from './errors.js'
import { IGNORE_FILE, IgnoreRules, isIgnored } from './ignore.js'

/** The recipe file a pushed directory is read from, before a `Dockerfile`. */
export const RECIPE_FILE = 'lizard.template.toml'
export const DOCKERFILE = 'Dockerfile'

const isFile = (p) => fs.stat(p).then((s) => s.isFile(), () => false)
const isDir = (p) => fs.stat(p).then((s) => s.isDirectory(), () => false)

/** `lizard.template.toml`, else a `Dockerfile` (which needs `name`: it has none) → `{ text, format }`. */
export async function readRecipe(root, name) {
  const tomlPath = path.join(root, RECIPE_FILE)
  const dockerPath = path.join(root, DOCKERFILE)
  if (await isFile(tomlPath)) return { text: await readText(tomlPath, RECIPE_FILE), format: 'toml' }
  if (await isFile(dockerPath)) {
    if (!name) throw new ContextError('a template built from a Dockerfile needs a name (a Dockerfile has none)')
    return { text: await readText(dockerPath, DOCKERFILE), format: 'dockerfile' }
  }
  if (!(await isDir(root))) throw new ContextError(`${JSON.stringify(root)} is not a directory`)
  throw new ContextError(`the directory has neither ${RECIPE_FILE} nor ${DOCKERFILE}`)
}

async function readText(p, shown) {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(await fs.readFile(p))
  } catch (e) {
    throw new ContextError(`cannot read ${shown}: ${e.message}`, { cause: e })
  }
}

/** SHA-256 of a file's content, hex. */
export async function hashFile(p) {
  const hash = createHash('sha256')
  for await (const chunk of createReadStream(p)) hash.update(chunk)
  return hash.digest('hex')
}

const byBytes = (a, b) => Buffer.compare(Buffer.from(a.path), Buffer.from(b.path))

/**
 * Walk `root` without following symlinks, hashing every file. Resolves to `{ entries,
 * filesByHash }`: the entries as sent (wire form, sorted by path) and, for each content
 * hash, a file that has it (for the upload).
 */
export async function scan(root, { app = false } = {}) {
  if (!(await isDir(root))) throw new ContextError(`${JSON.stringify(root)} is not a directory`)
  const entries = []
  const filesByHash = new Map()
  // An app directory (what `lizard up` sends) also honours .gitignore, and leaves .git out.
  const ignoreFiles = app ? [IGNORE_FILE, '.gitignore'] : [IGNORE_FILE]
  await walk(root, '', [], entries, filesByHash, ignoreFiles)
  entries.sort(byBytes)
  return { entries, filesByHash }
}

/** A name as UTF-8 text, or a ContextError naming it when it is not UTF-8. */
function utf8(raw, shownDir) {
  const name = raw.toString('utf8')
  if (!Buffer.from(name).equals(raw)) {
    throw new ContextError(`${JSON.stringify(shown(shownDir, name))}: the name is not UTF-8`)
  }
  return name
}

const shown = (relDir, name) => (relDir ? `${relDir}/${name}` : name)

async function walk(root, relDir, stack, entries, filesByHash, ignoreFiles) {
  const dir = relDir ? path.join(root, relDir) : root
  for (const ignoreFile of ignoreFiles) {
    const ignorePath = path.join(dir, ignoreFile)
    if (!(await isFile(ignorePath))) continue
    try {
      const text = await fs.readFile(ignorePath, 'utf8')
      stack = [...stack, new IgnoreRules(relDir, text.split('\n'))]
    } catch (e) {
      throw new ContextError(`cannot read ${shown(relDir, ignoreFile)}: ${e.message}`, { cause: e })
    }
  }
  let raw
  try {
    raw = await fs.readdir(dir, { encoding: 'buffer' })
  } catch (e) {
    throw new ContextError(`cannot read ${JSON.stringify(relDir || '.')}: ${e.message}`, { cause: e })
  }
  const names = raw.map((n) => utf8(n, relDir)).sort()
  for (const name of names) {
    const rel = shown(relDir, name)
    const full = path.join(dir, name)
    let st
    try {
      st = await fs.lstat(full)
    } catch (e) {
      throw new ContextError(`cannot read ${JSON.stringify(rel)}: ${e.message}`, { cause: e })
    }
    const directory = st.isDirectory()
    if (isIgnored(stack, rel, directory) || (ignoreFiles.length > 1 && directory && name === '.git')) continue
    const entry = { path: rel, mode: st.mode & 0o7777 }
    if (st.isSymbolicLink()) {
      const target = await fs.readlink(full, { encoding: 'buffer' })
      entry.type = 'symlink'
      entry.target = target.toString('utf8')
      if (!Buffer.from(entry.target).equals(target)) {
        throw new ContextError(`${JSON.stringify(rel)}: the link's target is not UTF-8`)
      }
    } else if (directory) {
      entry.type = 'dir'
    } else if (st.isFile()) {
      let sha256
      try {
        sha256 = await hashFile(full)
      } catch (e) {
        throw new ContextError(`cannot read ${JSON.stringify(rel)}: ${e.message}`, { cause: e })
      }
      Object.assign(entry, { type: 'file', sha256, size: st.size })
      if (!filesByHash.has(sha256)) filesByHash.set(sha256, full)
    } else {
      throw new ContextError(`${JSON.stringify(rel)} is neither a file, a directory nor a symbolic link`)
    }
    entries.push(entry)
    if (directory) await walk(root, rel, stack, entries, filesByHash, ignoreFiles)
  }
}
