// Several files as one tar archive (`fs.writeFiles`). Hand-written: the SDK has no runtime
// dependencies, Node has no tar, and writing ustar entries (with a PAX header for names
// longer than 100 bytes) takes a page. Only regular files are written; the server unpacks
// them, refusing any name that would leave the target directory.

const BLOCK = 512
const encoder = new TextEncoder()

/** The deepest directory all `paths` (absolute file paths) share. */
export function commonDir(paths) {
  const dirs = paths.map((p) => p.split('/').filter(Boolean).slice(0, -1))
  const common = []
  for (let i = 0; ; i++) {
    const part = dirs[0][i]
    if (part === undefined || !dirs.every((d) => d[i] === part)) break
    common.push(part)
  }
  return '/' + common.join('/')
}

function octal(value, width) {
  return value.toString(8).padStart(width - 1, '0') + '\0'
}

function header(name, size, mode, mtime, type) {
  const h = new Uint8Array(BLOCK)
  const put = (text, at, width) => h.set(encoder.encode(text).subarray(0, width), at)
  put(name, 0, 100)
  put(octal(mode & 0o7777, 8), 100, 8)
  put(octal(0, 8), 108, 8)
  put(octal(0, 8), 116, 8)
  put(octal(size, 12), 124, 12)
  put(octal(mtime, 12), 136, 12)
  put('        ', 148, 8) // the checksum counts its own field as spaces
  put(type, 156, 1)
  put('ustar\u000000', 257, 8)
  let sum = 0
  for (const b of h) sum += b
  put(octal(sum, 7) + ' ', 148, 8)
  return h
}

function padded(data) {
  const out = new Uint8Array(Math.ceil(data.length / BLOCK) * BLOCK)
  out.set(data)
  return out
}

/** A PAX record `"<len> path=<name>\n"`, whose length counts its own digits. */
function paxPath(name) {
  const body = ` path=${name}\n`
  let len = encoder.encode(body).length
  while (String(len + String(len).length).length !== String(len).length) len++
  len += String(len).length
  return encoder.encode(`${len}${body}`)
}

/** A tar archive of `entries` ({ name (relative), data: Uint8Array, mode }). */
export function writeTar(entries) {
  const parts = []
  const mtime = Math.floor(Date.now() / 1000)
  for (const { name, data, mode } of entries) {
    if (encoder.encode(name).length > 100) {
      const pax = paxPath(name)
      parts.push(header('PaxHeader', pax.length, 0o644, mtime, 'x'), padded(pax))
    }
    parts.push(header(name, data.length, mode, mtime, '0'), padded(data))
  }
  parts.push(new Uint8Array(BLOCK * 2))
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.length
  }
  return out
}
