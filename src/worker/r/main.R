# The R driver, part 5 of 5: the request loop and start-up.

# ------------------------------------------------------------------ requests

handle_control <- function(msg) {
  op <- msg$op
  reply <- tryCatch(
    withCallingHandlers(
      if (identical(op, 'inspect')) inspect(msg)
      else if (identical(op, 'complete')) complete(msg)
      else if (identical(op, 'save_state')) save_state(msg)
      else if (identical(op, 'load_state')) load_state(msg)
      else list(ok = FALSE, message = 'unknown request'),
      warning = function(w) invokeRestart('muffleWarning')),
    error = function(e) list(ok = FALSE, message = sprintf('%s failed: %s', op, conditionMessage(e))))
  send(c(list(ev = 'reply', id = msg$id), reply))
}

# ------------------------------------------------------------------ saved state
# The global environment serialized as save.image() does (docs/protocol.md,
# "Saved state"): a `state_data` event, then one JSON header line and the
# bytes of serialize(); loaded into a fresh R by unserialize(). Connections
# and external pointers (handles into native code) do not survive that:
# they are left out and named. Attached packages are attached again.

STATE_FORMAT <- 1L
BASE_PACKAGES <- c('base', 'stats', 'graphics', 'grDevices', 'utils', 'datasets',
                   'methods', 'tools', 'compiler', 'grid', 'parallel', 'splines', 'stats4')

r_version <- function() paste(R.version$major, R.version$minor, sep = '.')

state_packages <- function() {
  pk <- setdiff(loadedNamespaces(), BASE_PACKAGES)
  v <- vapply(pk, function(p) tryCatch(as.character(utils::packageVersion(p)), error = function(e) NA_character_), '')
  as.list(v[!is.na(v)])
}

attached_packages <- function() {
  setdiff(sub('^package:', '', grep('^package:', search(), value = TRUE)), BASE_PACKAGES)
}

unsaveable <- function(x) {
  if (inherits(x, 'connection')) return('a connection: open it again')
  if (typeof(x) == 'externalptr') return('an external pointer (a handle into native code): create it again')
  NULL
}

save_state <- function(msg) {
  env <- globalenv()
  keep <- character(0)
  skipped <- list()
  for (n in ls(env, all.names = TRUE)) {
    why <- unsaveable(get(n, envir = env))
    if (is.null(why)) keep <- c(keep, n) else skipped[[n]] <- why
  }
  data <- serialize(list(objects = mget(keep, envir = env), attached = attached_packages()), NULL)
  header <- charToRaw(paste0(to_json(list(format = STATE_FORMAT, version = r_version(),
                                          bytes = length(data))), '\n'))
  payload <- c(header, data)
  suspendInterrupts({
    write_event(to_json(list(ev = 'state_data', id = msg$id, bytes = length(payload))))
    writeBin(payload, state$ev_con)
    flush(state$ev_con)
  })
  list(ok = TRUE, cell = state$cell, version = r_version(), variables = as.list(keep),
       skipped = if (length(skipped)) skipped else structure(list(), names = character(0)),
       packages = state_packages(), bytes = length(payload))
}

# The n bytes that follow the request just read.
read_payload <- function(n) {
  chunks <- list()
  have <- min(length(state$rbuf), n)
  if (have > 0) {
    chunks[[1L]] <- state$rbuf[seq_len(have)]
    state$rbuf <- state$rbuf[-seq_len(have)]
  }
  left <- n - have
  while (left > 0) {
    chunk <- readBin(state$req_bin, 'raw', min(left, 1048576))
    if (!length(chunk)) quit_now()
    chunks[[length(chunks) + 1L]] <- chunk
    left <- left - length(chunk)
  }
  unlist(chunks, use.names = FALSE)
}

load_state <- function(msg) {
  data <- read_payload(as.numeric(msg$bytes))
  nl <- which(data == as.raw(10L))[1L]
  if (is.na(nl)) return(list(ok = FALSE, message = 'the saved state has no readable header'))
  header <- json_parse(rawToChar(data[seq_len(nl - 1L)]))
  if (!identical(as.integer(header$format), STATE_FORMAT))
    return(list(ok = FALSE, message = sprintf('the saved state is of format %s, not %d', header$format, STATE_FORMAT)))
  if (!identical(header$version, r_version()))
    return(list(ok = FALSE, message = sprintf('the state was saved by R %s; this R is %s', header$version, r_version())))
  changed <- character(0)
  for (p in names(msg$packages)) {
    here <- tryCatch(as.character(utils::packageVersion(p)), error = function(e) 'none')
    if (!identical(here, msg$packages[[p]])) changed <- c(changed, sprintf('%s %s, here %s', p, msg$packages[[p]], here))
  }
  if (length(changed))
    return(list(ok = FALSE, message = sprintf('the state was saved with other packages than this library has (%s); install those versions, or rebuild the session',
                                              paste(utils::head(changed, 5L), collapse = ', '))))
  saved <- unserialize(data[(nl + 1L):length(data)])
  for (p in saved$attached) suppressPackageStartupMessages(library(p, character.only = TRUE))
  list2env(saved$objects, envir = globalenv())
  list(ok = TRUE, variables = as.list(names(saved$objects)), reimported = list())
}

handle_line <- function(line) {
  # A JSON line is a late reply to a cancelled tool call: data, never code.
  if (startsWith(line, '{')) return(invisible())
  # Not parse_request(): main_loop() catches a failure here.
  msg <- eval(str2lang(line), baseenv())
  if (!is.list(msg)) return(invisible())
  if (identical(msg$op, 'exec')) {
    run_cell(msg)
  } else if (!is.null(msg$id)) {
    handle_control(msg)
  }
  # An `input` with no pending request (its cell ended) is dropped.
}

main_loop <- function() {
  # The handlers are set up once for many requests (a tryCatch per request
  # costs more than a small cell); a failure ends the inner loop and the
  # next turn sets them up again. No warning muffler here: a cell's warnings
  # must reach R's default handler (the driver's own work outside cells
  # muffles its warnings).
  repeat {
    tryCatch(repeat {
      if (is.null(state$pending)) state$pending <- next_line()
      # An interrupt that came while idle (a cell ended just before it) is
      # taken here, by the interrupt handler below, not by the next cell;
      # the request waits in state$pending for the next turn.
      allowInterrupts(Sys.sleep(0))
      line <- state$pending
      state$pending <- NULL
      handle_line(line)
    }, error = driver_failed, interrupt = function(c) NULL)
  }
}

# The server waits for a done event whatever happens in the driver.
driver_failed <- function(e) {
  cell <- state$running
  if (is.null(cell)) return(invisible())
  state$running <- NULL
  text <- paste0('ferrepl R driver error: ', tryCatch(conditionMessage(e), error = function(e) '?'))
  tryCatch(send_fenced(list(ev = 'done', cell = cell, status = 'error', value = NULL,
                            error = list(type = 'DriverError', message = text, traceback = text), elapsed_ms = 0)),
           error = function(e) NULL)
}

# ------------------------------------------------------------------ start

setup_session <- function() {
  # Non-ASCII text must reach the server as UTF-8 whatever locale we got.
  if (!isTRUE(l10n_info()[['UTF-8']])) suppressWarnings(Sys.setlocale('LC_CTYPE', 'C.UTF-8'))
  nonce <- Sys.getenv('FERREPL_NONCE', '')
  if (!nzchar(nonce)) nonce <- strrep('0', 32L)
  Sys.unsetenv('FERREPL_NONCE')
  state$marker_prefix <- c(as.raw(0L), charToRaw('FERREPL:'), charToRaw(nonce), charToRaw(':'))
  num_env <- function(name, default) {
    v <- suppressWarnings(as.numeric(Sys.getenv(name, '')))
    Sys.unsetenv(name)
    if (is.na(v) || v <= 0) default else v
  }
  state$max_image_bytes <- num_env('FERREPL_MAX_IMAGE_BYTES', 4194304)
  state$max_value_chars <- num_env('FERREPL_MAX_VALUE_CHARS', 200000)
  state$cairo <- isTRUE(capabilities('cairo'))

  # .Last.value as the console keeps it.
  state$set_last_value <- function(v) NULL
  tryCatch({
    unlockBinding('.Last.value', baseenv())
    state$set_last_value <- function(v) assign('.Last.value', v, envir = baseenv())
  }, error = function(e) NULL)

  options(device = png_device, help_type = 'text', pager = pager, browser = no_browser,
          editor = no_editor, pdfviewer = pdf_viewer_script(), keep.source = TRUE, menu.graphics = FALSE,
          # No help server: it could not answer while the driver waits for
          # requests; HTML vignettes go to the browser option as files.
          help.ports = 0L)
  # Loading tools costs ~80 ms of start-up: Rd2txt's options are set when
  # help (or anything else) loads it.
  rd_options <- function(...) tryCatch(tools::Rd2txt_options(underline_titles = FALSE), error = function(e) NULL)
  if (isNamespaceLoaded('tools')) rd_options() else setHook(packageEvent('tools', 'onLoad'), rd_options)

  rebind('readline', make_readline())
  rebind('readLines', make_readLines(base::readLines))
  rebind('scan', make_scan(base::scan))
  rebind('browser', make_browser())
  rebind('closeAllConnections', make_close_all())
  rebind('menu', make_menu(), 'utils')
  rebind('install.packages', make_install_packages(utils::install.packages), 'utils')
  attach_tool_functions()
}

ferrepl_main <- function(requests) {
  # The JIT would compile each set-up function before its one call (~80 ms
  # of start-up): off while setting up, back for the session.
  jit <- .Internal(enableJIT(0L))
  suspendInterrupts({
    # Our own binary reader: chunked reads instead of one byte per call.
    state$req_bin <- fifo('/dev/fd/3', open = 'rb', blocking = TRUE)
    try(close(requests), silent = TRUE)
    state$ev_con <- open_out(4L)
    state$out_con <- open_out(1L)
    state$err_con <- open_out(2L)
    setup_session()
    send(list(ev = 'ready', pid = Sys.getpid(),
              version = paste(R.version$major, R.version$minor, sep = '.'),
              executable = file.path(R.home('bin'), 'R')))
    .Internal(enableJIT(jit))
    main_loop()
  })
}
