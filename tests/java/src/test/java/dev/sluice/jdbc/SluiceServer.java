package dev.sluice.jdbc;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.Comparator;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * A real {@code sluice serve} process on a fresh temporary data directory and a
 * random loopback port. The binary is {@code $SLUICE_BIN}, else
 * {@code ../../target/debug/sluice} (build it with {@code cargo build --bins}).
 * Everything the server prints is forwarded to stderr, prefixed with
 * {@code [sluice] }.
 */
final class SluiceServer implements AutoCloseable {
  private static final long STARTUP_TIMEOUT_SECONDS = 60;
  private static final long SHUTDOWN_TIMEOUT_SECONDS = 30;
  private static final Pattern LISTENING =
      Pattern.compile("listening on (\\[[0-9a-fA-F:]+\\]|[0-9.]+):(\\d+)");

  private final Path dataDir;
  private final Process process;
  private final Thread forwarder;
  private final int port;

  private SluiceServer(Path dataDir, Process process, Thread forwarder, int port) {
    this.dataDir = dataDir;
    this.process = process;
    this.forwarder = forwarder;
    this.port = port;
  }

  static Path binary() {
    String env = System.getenv("SLUICE_BIN");
    Path bin = env != null && !env.isEmpty()
        ? Paths.get(env)
        : Paths.get("..", "..", "target", "debug", "sluice").toAbsolutePath().normalize();
    if (!Files.isRegularFile(bin)) {
      throw new IllegalStateException(
          "no sluice binary at " + bin + ": run `cargo build --bins` or set SLUICE_BIN");
    }
    return bin;
  }

  static SluiceServer start() throws IOException, InterruptedException {
    return start(List.of());
  }

  /** Starts a server with extra {@code serve} flags. */
  static SluiceServer start(List<String> extra) throws IOException, InterruptedException {
    Path dataDir = Files.createTempDirectory("sluice-jdbc-");
    List<String> command = new java.util.ArrayList<>(List.of(binary().toString(), "serve",
        "--data-dir", dataDir.toString(), "--listen", "127.0.0.1:0"));
    command.addAll(extra);
    ProcessBuilder builder = new ProcessBuilder(command);
    builder.environment().put("NO_COLOR", "1");
    builder.redirectErrorStream(true);
    builder.redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")));
    Process process = builder.start();
    CompletableFuture<Integer> announced = new CompletableFuture<>();
    Thread forwarder = new Thread(() -> {
      try (BufferedReader out = new BufferedReader(
          new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
        String line;
        while ((line = out.readLine()) != null) {
          System.err.println("[sluice] " + line);
          Matcher m = LISTENING.matcher(line);
          if (m.find()) {
            announced.complete(Integer.parseInt(m.group(2)));
          }
        }
      } catch (IOException e) {
        // The process is gone.
      } finally {
        announced.completeExceptionally(
            new IllegalStateException("sluice exited before printing `listening on HOST:PORT`"));
      }
    }, "sluice-output");
    forwarder.setDaemon(true);
    forwarder.start();
    int port;
    try {
      port = announced.get(STARTUP_TIMEOUT_SECONDS, TimeUnit.SECONDS);
    } catch (ExecutionException | TimeoutException e) {
      stopProcess(process);
      deleteRecursively(dataDir);
      throw new IllegalStateException("sluice did not print `listening on HOST:PORT` within "
          + STARTUP_TIMEOUT_SECONDS + "s", e);
    }
    return new SluiceServer(dataDir, process, forwarder, port);
  }

  int port() {
    return port;
  }

  String url() {
    return "jdbc:postgresql://127.0.0.1:" + port + "/sluice";
  }

  Properties properties() {
    Properties props = new Properties();
    props.setProperty("user", "sluice");
    props.setProperty("connectTimeout", "10");
    props.setProperty("loginTimeout", "10");
    // Every read from the server is bounded, so a stuck server fails the test.
    props.setProperty("socketTimeout", "30");
    props.setProperty("ApplicationName", "sluice-jdbc-tests");
    return props;
  }

  Connection connect() throws SQLException {
    return DriverManager.getConnection(url(), properties());
  }

  Connection connect(Properties extra) throws SQLException {
    Properties props = properties();
    props.putAll(extra);
    return DriverManager.getConnection(url(), props);
  }

  @Override
  public void close() throws IOException, InterruptedException {
    stopProcess(process);
    forwarder.join(TimeUnit.SECONDS.toMillis(5));
    deleteRecursively(dataDir);
  }

  private static void stopProcess(Process process) throws InterruptedException {
    if (!process.isAlive()) {
      return;
    }
    process.destroy();
    if (!process.waitFor(SHUTDOWN_TIMEOUT_SECONDS, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(SHUTDOWN_TIMEOUT_SECONDS, TimeUnit.SECONDS);
    }
  }

  private static void deleteRecursively(Path dir) throws IOException {
    if (!Files.exists(dir)) {
      return;
    }
    try (Stream<Path> paths = Files.walk(dir)) {
      paths.sorted(Comparator.reverseOrder()).forEach(p -> {
        try {
          Files.deleteIfExists(p);
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      });
    }
  }
}
