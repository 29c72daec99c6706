package dev.regauge.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system without a process per call.
 *
 * <p>Without Hadoop's native library (no registry here serves one), RawLocalFileSystem
 * runs {@code chmod} for every file it creates and {@code readlink} for every
 * rename made through FileContext: four to six processes per Delta commit and one
 * per Parquet file, about 3 ms of CPU each. A Spark driver's profile (JFR) of
 * tests/spark_jobs/test_silver.py counted over 3,100 in two minutes. The readlink
 * never finds anything either: Hadoop passes it the path as a {@code file:} URI.
 * Both calls are answered here through java.nio, with the same outcome.
 */
public class NoForkRawLocalFileSystem extends RawLocalFileSystem {

  private static final PosixFilePermission[] BITS = PosixFilePermission.values();

  /** The mode's nine rwx bits as java.nio's set; BITS runs from owner read (0400) down. */
  static Set<PosixFilePermission> posix(FsPermission permission) {
    int mode = permission.toShort();
    Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (0400 >> i)) != 0) {
        out.add(BITS[i]);
      }
    }
    return out;
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (permission.getStickyBit()) {
      super.setPermission(p, permission); // java.nio cannot set the sticky bit
      return;
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission));
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    // What Hadoop returns for anything but a link, a missing path included
    // (FileNotFoundException).
    return getFileStatus(f);
  }

  @Override
  public String toString() {
    return "LocalFS (no fork)";
  }
}
