package dev.sluice.jdbc;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;

/**
 * pgjdbc logs in with SCRAM-SHA-256 over TLS that verifies the server against a CA made for
 * the test ({@code tests/fixtures/tls/make-certs.sh}), with channel binding required; a wrong
 * password is 28P01.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(60)
class SecurityTest {
  private static final String PASSWORD = "correct horse";
  private Path certs;
  private SluiceServer server;

  @BeforeAll
  void start() throws Exception {
    certs = Files.createTempDirectory("sluice-certs-");
    Path script = Paths.get("..", "fixtures", "tls", "make-certs.sh").toAbsolutePath().normalize();
    Process make = new ProcessBuilder("bash", script.toString(), certs.toString()).inheritIO().start();
    assertTrue(make.waitFor(60, TimeUnit.SECONDS) && make.exitValue() == 0, "make-certs.sh");
    server = SluiceServer.start(List.of("--password", PASSWORD,
        "--tls-cert", certs.resolve("server.pem").toString(),
        "--tls-key", certs.resolve("server.key").toString()));
  }

  @AfterAll
  void stop() throws Exception {
    if (server != null) {
      server.close();
    }
  }

  private Properties tls(String password) {
    Properties props = new Properties();
    props.setProperty("password", password);
    props.setProperty("sslmode", "verify-full");
    props.setProperty("sslrootcert", certs.resolve("ca.pem").toString());
    props.setProperty("channelBinding", "require");
    return props;
  }

  @Test
  void scramWithChannelBindingOverVerifiedTls() throws SQLException {
    try (Connection conn = server.connect(tls(PASSWORD));
        Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery(
            "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")) {
      assertTrue(rs.next());
      assertTrue(rs.getBoolean(1));
      assertEquals("TLSv1.3", rs.getString(2));
    }
  }

  @Test
  void aWrongPasswordIs28P01() {
    SQLException e = assertThrows(SQLException.class, () -> server.connect(tls("wrong")).close());
    assertEquals("28P01", e.getSQLState());
  }
}
