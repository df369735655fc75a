# The R driver, part 5 of 5: the request loop and start-up.

# ------------------------------------------------------------------ requests

handle_control <- function(msg) {
  op <- msg$op
  reply <- tryCatch(
    withCallingHandlers(
      if (identical(op, 'inspect')) inspect(msg)
      else if (identical(op, 'complete')) complete(msg)
      else list(ok = FALSE, message = 'unknown request'),
      warning = function(w) invokeRestart('muffleWarning')),
    error = function(e) list(ok = FALSE, message = sprintf('%s failed: %s', op, conditionMessage(e))))
  send(c(list(ev = 'reply', id = msg$id), reply))
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
