package dev.sluice.jdbc;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.Statement;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;

/** Each test class gets its own sluice server, started before its first test. */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(60)
abstract class ServerTest {
  protected SluiceServer server;

  @BeforeAll
  void startServer() throws Exception {
    server = SluiceServer.start();
  }

  @AfterAll
  void stopServer() throws Exception {
    if (server != null) {
      server.close();
    }
  }

  protected Connection connect() throws SQLException {
    return server.connect();
  }

  protected static void execute(Connection conn, String sql) throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute(sql);
    }
  }
}
