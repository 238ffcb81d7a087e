# Loads the Vagrantfile under a stand-in for Vagrant and writes each inline
# shell provisioner to DIR/provision-N.sh, so that provisioner mode (which
# needs a Vagrant box, not available here) is at least rendered and checked
# with `bash -n` (tests/lab/vagrant-check):
#   TB_PROVISIONER=1 ruby tests/lab/vagrant-render.rb Vagrantfile DIR
vagrantfile, $out = ARGV
abort "usage: ruby vagrant-render.rb VAGRANTFILE DIR" unless vagrantfile && $out
$n = 0

# Accepts any configuration call; records `provision "shell", inline: ...`.
class Recorder
  def method_missing(name, *args, **kw, &blk)
    if name == :provision && args[0] == "shell" && kw[:inline]
      File.write(File.join($out, "provision-#{$n += 1}.sh"), kw[:inline])
    end
    blk&.call(Recorder.new)
    Recorder.new
  end

  def respond_to_missing?(*) = true
end

module Vagrant
  def self.configure(_version)
    yield Recorder.new
  end
end

$PROGRAM_NAME = "vagrant" # not `ruby Vagrantfile <command>`
load vagrantfile
abort "no shell provisioners rendered" if $n.zero?
puts "rendered #{$n} provisioner scripts into #{$out}"
