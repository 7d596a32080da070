# An R code context for Lizard's code service (code_server.py): one R process whose global
# environment persists between cells. Debian has no R Jupyter kernel (IRkernel left
# testing), so this runner speaks the service's own line protocol, as js_context.js does:
# cells come as JSON lines on stdin ({code, envs, nonce}); what a cell prints goes to this
# process's stdout and stderr as it happens; the visible value of each top-level
# expression, each plot (PNG), errors and the end of the cell are JSON lines carrying the
# cell's nonce on the private pipe LIZARD_EVENTS_FD, so nothing a cell prints can forge them.
local({
  # Text in and out is UTF-8 whatever the guest's locale.
  invisible(Sys.setlocale("LC_ALL", "C.UTF-8"))
  events <- file(paste0("/dev/fd/", Sys.getenv("LIZARD_EVENTS_FD")), open = "w", raw = TRUE)
  Sys.unsetenv("LIZARD_EVENTS_FD")
  plots <- file.path(tempdir(), "lizard-plot-%03d.png")
  input <- file("stdin", open = "r", encoding = "UTF-8")

  send <- function(nonce, event) {
    event$cell <- nonce
    writeLines(jsonlite::toJSON(event, auto_unbox = TRUE, null = "null"), events)
    flush(events)
  }
  shown <- function(value) {
    paste(utils::capture.output(print(value)), collapse = "\n")
  }
  # An error as R prints it: "Error in f(x) : …", or "Error: …" for one raised by the
  # cell's own top level (whose call is this runner's eval) or by parsing it.
  ours <- list(quote(eval(exprs[[i]], globalenv())), quote(parse(text = cell$code, keep.source = FALSE)))
  error_event <- function(e) {
    call <- conditionCall(e)
    mine <- is.null(call) || any(vapply(ours, identical, logical(1), call))
    where <- if (mine) "" else paste0(" in ", paste(deparse(call), collapse = "\n"))
    message <- conditionMessage(e)
    list(type = "error", name = class(e)[[1]], value = message, traceback = paste0("Error", where, ": ", message))
  }
  # Each plot page of the cell, in order, as a PNG result; the files go.
  send_plots <- function(nonce) {
    for (path in sort(Sys.glob(file.path(tempdir(), "lizard-plot-*.png")))) {
      size <- file.size(path)
      if (!is.na(size) && size > 0) {
        png <- gsub("\n", "", jsonlite::base64_enc(readBin(path, "raw", size)), fixed = TRUE)
        send(nonce, list(type = "result", data = list("image/png" = png, "text/plain" = "<plot>"), isMainResult = FALSE))
      }
      unlink(path)
    }
  }
  run_cell <- function(cell) {
    nonce <- cell$nonce
    envs <- cell$envs
    saved <- if (length(envs)) Sys.getenv(names(envs), unset = NA, names = TRUE) else character()
    if (length(envs)) do.call(Sys.setenv, as.list(envs))
    grDevices::png(plots, width = 640, height = 480)
    device <- grDevices::dev.cur()
    tryCatch(
      {
        exprs <- parse(text = cell$code, keep.source = FALSE)
        for (i in seq_along(exprs)) {
          out <- withVisible(eval(exprs[[i]], globalenv()))
          if (out$visible) {
            result <- list("text/plain" = shown(out$value))
            send(nonce, list(type = "result", data = result, isMainResult = i == length(exprs)))
          }
        }
      },
      error = function(e) send(nonce, error_event(e)),
      interrupt = function(e) NULL
    )
    if (device %in% grDevices::dev.list()) grDevices::dev.off(device)
    send_plots(nonce)
    for (name in names(saved)) {
      if (is.na(saved[[name]])) Sys.unsetenv(name) else do.call(Sys.setenv, stats::setNames(list(saved[[name]]), name))
    }
    flush(stdout())
    flush(stderr())
    send(nonce, list(type = "done"))
  }

  repeat {
    line <- readLines(input, n = 1)
    if (!length(line)) break
    cell <- jsonlite::fromJSON(line, simplifyVector = FALSE)
    cell$envs <- unlist(cell$envs)
    run_cell(cell)
  }
})
