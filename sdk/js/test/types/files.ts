// The file calls' declarations, as a program would use them (checked by `npm run typecheck`).
import { Lizard, type FileInfo, type FsEvent, type ArchiveResult } from '@lizard-build/sdk'

const lizard = new Lizard({ project: 'my-project' })
const sandbox = await lizard.create('base')
const info: FileInfo = await sandbox.fs.getInfo('/app/main.py')
const kind: 'file' | 'dir' | 'symlink' | 'other' = info.type
const there: boolean = await sandbox.fs.exists('/app')
const moved: FileInfo = await sandbox.fs.rename('/app/a', '/app/b')
const wrote: ArchiveResult = await sandbox.fs.writeFiles({ '/app/a.txt': 'a', '/app/b.bin': new Uint8Array([1]) })
const tar: Uint8Array = await sandbox.fs.downloadDir('/app')
await sandbox.fs.writeArchive('/copy', tar)
const handle = await sandbox.fs.watch('/app', {
  recursive: true,
  onEvent: (e: FsEvent) => console.log(e.type, e.path, e.newPath ?? '', e.isDir),
  onExit: (err: Error) => console.error(err.message),
})
await handle.stop()
console.log(kind, there, moved.path, wrote.entries)
